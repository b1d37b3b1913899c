"""The sandbox part of the command line: `serve` flags and `execgate doctor` (with the
running daemon's MCP servers, doctor_servers.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from execgate.executor.sandbox.registry import CHOICES, SandboxConfig, daemon_id, probe_all

from . import doctor_servers


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sandbox",
        default="auto",
        choices=CHOICES,
        help="default sandbox for process-based tools (auto: bwrap if it works here, "
        "else process); policy may choose per tool",
    )
    p.add_argument(
        "--sandbox-ro",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="extra host path bwrap binds read-only (for example an interpreter "
        "outside /usr); repeatable",
    )
    p.add_argument(
        "--docker-image", default="", help="image for the docker sandbox (default: none)"
    )
    p.add_argument(
        "--docker-mode",
        default="per-call",
        choices=["per-call", "warm"],
        help="docker: a container per call, or one warm container per run",
    )
    p.add_argument(
        "--bwrap-mode",
        default="warm",
        choices=["warm", "cold"],
        help="bwrap: each run's calls in a sandbox built once (warm; cold where the kernel "
        "lacks what it needs), or a sandbox built per call (cold)",
    )
    p.add_argument(
        "--warm-sandboxes",
        type=_sandbox_count,
        default=64,
        metavar="N",
        help="bwrap warm mode: sandboxes kept at most, one per busy run or workspace "
        "(about 14 MiB each; past them a call gets a cold sandbox)",
    )
    p.add_argument(
        "--run-as",
        default="",
        metavar="USER[:GROUP]",
        help="process sandbox under a root daemon: the unprivileged user commands run as "
        "(default: the workspace's owner if not root, else nobody; uid 0 is refused)",
    )
    p.add_argument(
        "--no-cgroups",
        action="store_true",
        help="do not create per-call cgroups (limits by rlimit only, kill by sweep)",
    )


def config_from(args: argparse.Namespace) -> SandboxConfig:
    return SandboxConfig(
        default=args.sandbox,
        ro_paths=tuple(p.absolute() for p in args.sandbox_ro),
        docker_image=args.docker_image,
        docker_mode=args.docker_mode,
        bwrap_mode=args.bwrap_mode,
        warm_sandboxes=args.warm_sandboxes,
        cgroups=not args.no_cgroups,
        run_as=args.run_as,
        workspace=args.workspace,
    )


OFFLINE_IMAGE = """\
docker images need no registry; make one offline, then --docker-image NAME:
  tar -C ROOTFS -c . | docker import - NAME  (ROOTFS: your tools' commands)
  docker/make-base-image.sh NAME             (a minimal Debian, debootstrap)"""


def add_doctor(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor", help="which sandbox backends work here; the daemon's MCP servers' state"
    )
    add_serve_args(p)
    doctor_servers.add_args(p)
    p.add_argument("--state-dir", type=Path, default=Path("var"), help=argparse.SUPPRESS)
    p.add_argument("--workspace", type=Path, default=Path("workspace"), help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    config = config_from(args)
    probes, default = probe_all(config, "doctor-" + daemon_id(args.state_dir))
    chosen = next(p for p in probes if p.name == default)
    servers, error = doctor_servers.fetch(args) if doctor_servers.wanted(args) else ([], "")
    # A server that never started is something to fix, like a default sandbox that fails;
    # so is a daemon named by --addr that cannot be asked.
    healthy = chosen.ok and all(doctor_servers.state(s) != "failed" for s in servers)
    healthy = healthy and not (error and args.addr)
    if args.json:
        backends = [{"name": p.name, "works": p.ok, "detail": p.detail} for p in probes]
        found = {"backends": backends, "default": default, "default_works": chosen.ok}
        print(json.dumps(found | doctor_servers.as_json(servers, error)))
        return 0 if healthy else 1
    width = max(len(p.name) for p in probes)
    for probe in probes:
        state = "works " if probe.ok else "absent"
        print(f"{probe.name:<{width}}  {state}  {probe.detail}")
    docker = next((p for p in probes if p.name == "docker"), None)
    if docker is not None and not docker.ok and "image" in docker.detail:
        print(OFFLINE_IMAGE)
    chosen = next(p for p in probes if p.name == default)
    print(f"default: {default}" + ("" if chosen.ok else " (does NOT work here)"))
    if doctor_servers.wanted(args):
        doctor_servers.show(servers, error)
    if not chosen.ok:
        print(f"execgate: the default sandbox {default} does not work here", file=sys.stderr)
    return 0 if healthy else 1


def _sandbox_count(text: str) -> int:
    """--warm-sandboxes: an integer from 1 to 1024."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= count <= 1024:
        raise argparse.ArgumentTypeError(f"{count} is outside 1-1024")
    return count
