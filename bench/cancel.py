"""Cancellation and sandbox cost: how fast a stop is, how complete, and what a sandbox costs.

One run measures, interleaved in rounds on this (small, shared) machine:

  spawn      `true` started, supervised to its end and cleaned up through each
             backend's own API (executor.sandbox: start -> supervise -> output ->
             release), against a bare `asyncio.create_subprocess_exec("true")`
             with the same pipes, in the same rounds: p50 and ratio to bare.
             bwrap cold (a sandbox built per call) and warm (a run's sandbox built
             once, each call in a host of it); `bwrap-alone` is bubblewrap itself
             with a cold call's arguments, spawned like bare: what the namespaces
             cost before execgate adds anything. Docker: a container per call
             (cold) and an exec in a warm container.
  cooperative through the real daemon, per backend and mode: a command that exits
             on SIGTERM is cancelled once STARTED; latency = the outcome's
             `stopped` mark minus its `cancel_requested` mark (daemon clock), and
             as the client sees it (Cancel sent -> FINISHED received).
  force      a command that ignores SIGTERM and leaves a setsid grandchild that
             ignores it too, cancelled with grace G: overshoot = stopped minus
             (cancel_requested + G); survivors = the outcome's count plus a /proc
             scan for the call's tag after the outcome (must both be 0).

Goals (issue 19): cooperative p99 <= 50 ms; force overshoot p99 <= 100 ms;
survivors 0 in every stop; warm bwrap spawn <= 2x bare; docker warm exec p50 <=
40 ms. Each is printed MET / NOT MET with the load average beside the run. The exit
status reflects only breakage (a survivor, a wrong stop mode, a backend that
fails), never a time.
Results go to bench/results/cancel.json (git-ignored).

    python bench/cancel.py            # full run
    python bench/cancel.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/cancel.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

from bench.dispatch import environment  # noqa: E402
from execgate.client import AsyncClient, Call, EventKind, Outcome, StopMode  # noqa: E402
from execgate.executor.sandbox import Launch, Sandbox, procscan  # noqa: E402
from execgate.executor.sandbox.bwrap import BwrapSandbox, bwrap_argv  # noqa: E402
from execgate.executor.sandbox.cgroup import CgroupRoot, remove_root  # noqa: E402
from execgate.executor.sandbox.ladder import CancelScope, supervise  # noqa: E402
from execgate.executor.sandbox.process import ProcessSandbox  # noqa: E402
from execgate.executor.sandbox.warm_pool import WarmBwrapSandbox  # noqa: E402
from tests.daemon import Daemon  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cancel.json"
COOPERATIVE = "trap 'exit 0' TERM; sleep 1000 & wait"
STUBBORN = "trap '' TERM; (setsid sh -c \"trap '' TERM; sleep 1000\" &); sleep 1000"
FORCE_GRACE = 0.2
LAUNCH: dict[str, Any] = {
    "argv": ("true",),
    "env": {"PATH": "/usr/bin:/bin"},
    "stdin": None,
    "writable": False,
    "run_id": "bench",
}
GOALS = {"cooperative_ms": 50.0, "force_overshoot_ms": 100.0, "warm_ratio": 2.0, "warm_ms": 40.0}
# The stops measured: the daemon's backend and mode for each name.
STOP_VARIANTS = {
    "process": ["--sandbox", "process"],
    "bwrap-warm": ["--sandbox", "bwrap", "--bwrap-mode", "warm"],
    "bwrap-cold": ["--sandbox", "bwrap", "--bwrap-mode", "cold"],
    "docker": ["--docker-mode", "per-call"],
    "docker-warm": ["--docker-mode", "warm"],
}


class BenchError(Exception):
    """Something broke (not: something was slow)."""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": pct(values, 0.5), "p99": pct(values, 0.99)}


# ------------------------------------------------------------------ spawn overhead


async def bare_spawn(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *(argv or ("true",)),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    await proc.communicate()


def sandbox_spawn(sandbox: Sandbox, workspace: Path) -> Callable[[], Awaitable[None]]:
    async def once() -> None:
        launch = Launch(**LAUNCH, cwd=workspace, workspace=workspace, marker=uuid.uuid4().hex[:16])
        running = await sandbox.start(launch)
        try:
            stopped = await supervise(running, CancelScope(), time_limit=30, grace=1, max_grace=1)
            await running.output()
        finally:
            await running.release()
        if stopped.exit.code != 0:
            raise BenchError(f"{sandbox.name}: `true` exited {stopped.exit}")

    return once


async def interleaved(
    cases: dict[str, Callable[[], Awaitable[None]]], rounds: int, per_round: int
) -> dict[str, list[float]]:
    """Milliseconds per run of each case, the cases interleaved round by round (so the
    machine's load falls on all of them alike), after three warm-up runs each."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():  # warm-up: page cache, image layers, first container
        for _ in range(3):
            await fn()
    for _ in range(rounds):
        for name, fn in cases.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                await fn()
                samples[name].append((time.perf_counter() - t0) * 1000)
    return samples


async def spawn_costs(
    cases: dict[str, Callable[[], Awaitable[None]]], rounds: int, per_round: int
) -> dict[str, dict[str, float]]:
    samples = await interleaved(cases, rounds, per_round)
    bare = statistics.median(samples["bare"])
    out = {}
    for name, values in samples.items():
        s = summary(values)
        s["ratio_to_bare"] = s["p50"] / bare
        out[name] = s
    return out


def docker_cases(
    workspace: Path, opened: list[Sandbox]
) -> dict[str, Callable[[], Awaitable[None]]]:
    """Cold (a container per call) and warm (exec in a run's container), if docker works.

    The sandboxes made go to `opened`, to be closed (their containers removed) after."""
    try:
        from execgate.executor.sandbox.docker import DockerSandbox
        from tests.docker_image import docker_available, ensure_test_image
    except ImportError as exc:
        print(f"docker: not measured ({exc})")
        return {}
    if not docker_available():
        print("docker: not measured (dockerd not reachable)")
        return {}
    image = ensure_test_image()
    cold = DockerSandbox(image, daemon_id="bench-cold", mode="per-call")
    warm = DockerSandbox(image, daemon_id="bench-warm", mode="warm")
    opened += [cold, warm]
    return {
        "docker-cold": sandbox_spawn(cold, workspace),
        "docker-warm": sandbox_spawn(warm, workspace),
    }


# ------------------------------------------------------------------ stops through the daemon


async def stop_once(
    client: AsyncClient, script: str, grace: float | None
) -> tuple[Outcome, float, list[int]]:
    """Start `script`, cancel it once STARTED; the outcome, client-seen ms, tagged survivors."""
    tag = uuid.uuid4().hex
    call_id = "c" + tag[:12]
    call = Call(
        tool="run_command",
        call_id=call_id,
        arguments={"argv": ["sh", "-c", script], "env": {"EG_BENCH": tag}},
    )
    sent = 0.0
    outcome: Outcome | None = None
    async for event in client.stream([call]):
        if event.kind is EventKind.STARTED:
            # Both scripts have two processes once their traps are set and their
            # sleep runs; a signal before that would test the script, not the stop.
            await wait_tagged(tag, 2)
            sent = time.perf_counter()
            await client.cancel(call_id=call_id, reason="bench", grace=grace)
        elif event.kind is EventKind.FINISHED:
            outcome = event.outcome
    seen = (time.perf_counter() - sent) * 1000
    assert outcome is not None
    return outcome, seen, procscan.with_marker("EG_BENCH", tag)


async def wait_tagged(tag: str, count: int) -> None:
    """Until the command's processes exist (so the stop has something to stop)."""
    for _ in range(500):
        if len(procscan.with_marker("EG_BENCH", tag)) >= count:
            return
        await asyncio.sleep(0.002)
    raise BenchError("the command's processes never appeared")


def mark_at(outcome: Outcome, phase: str) -> float:
    m = outcome.mark(phase)
    if m is None:
        raise BenchError(f"outcome has no {phase} mark: {outcome}")
    return m.at


async def stops(address: str, backend: str, n: int) -> dict[str, Any]:
    coop_ms, coop_seen, over_ms, survivors = [], [], [], 0
    async with AsyncClient(address, run_id=f"bench-{backend}") as client:
        for _ in range(n):
            o, seen, left = await stop_once(client, COOPERATIVE, None)
            if o.stopped_how is not StopMode.COOPERATIVE:
                raise BenchError(f"{backend}: cooperative stop was {o.stopped_how}: {o.message}")
            coop_ms.append((mark_at(o, "stopped") - mark_at(o, "cancel_requested")) * 1000)
            coop_seen.append(seen)
            survivors += len(left) + (o.evidence.survivors or 0)
        for _ in range(n):
            o, seen, left = await stop_once(client, STUBBORN, FORCE_GRACE)
            if o.stopped_how is not StopMode.FORCE_TERMINATED:
                raise BenchError(f"{backend}: forced stop was {o.stopped_how}: {o.message}")
            due = mark_at(o, "cancel_requested") + FORCE_GRACE
            over_ms.append((mark_at(o, "stopped") - due) * 1000)
            survivors += len(left) + (o.evidence.survivors or 0)
    return {
        "cooperative_ms": summary(coop_ms),
        "cooperative_client_ms": summary(coop_seen),
        "force_overshoot_ms": summary(over_ms),
        "survivors": survivors,
    }


def daemon_args(variant: str) -> list[str]:
    if not variant.startswith("docker"):
        return STOP_VARIANTS[variant]
    from tests.docker_image import ensure_test_image

    return ["--sandbox", "docker", "--docker-image", ensure_test_image(), *STOP_VARIANTS[variant]]


async def measure_stops(tmp: Path, variants: list[str], n: int) -> dict[str, Any]:
    results = {}
    for variant in variants:
        root = tmp / f"daemon-{variant}"
        root.mkdir()
        daemon = Daemon(root, *daemon_args(variant)).start()
        try:
            if variant.startswith("docker"):  # the container user is the workspace owner
                os.chown(daemon.workspace, 1000, 1000)
            results[variant] = await stops(daemon.address, variant, n)
        finally:
            daemon.stop()
    return results


# ------------------------------------------------------------------ report


def report(spawn: dict[str, dict[str, float]], stop: dict[str, Any]) -> list[str]:
    print(f"\n{'spawn (true)':<14}{'p50 ms':>9}{'p99 ms':>9}{'x bare':>8}")
    for name, s in spawn.items():
        print(f"{name:<14}{s['p50']:>9.2f}{s['p99']:>9.2f}{s['ratio_to_bare']:>8.2f}")
    head = ["coop p50", "p99", "client p50", "force+ p50", "p99", "surv"]
    widths = [9, 7, 11, 11, 7, 6]
    print(f"\n{'stop':<12}" + "".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    for name, r in stop.items():
        c, cc, f = r["cooperative_ms"], r["cooperative_client_ms"], r["force_overshoot_ms"]
        print(
            f"{name:<12}{c['p50']:>9.1f}{c['p99']:>7.1f}{cc['p50']:>11.1f}"
            f"{f['p50']:>11.1f}{f['p99']:>7.1f}{r['survivors']:>6}"
        )
    print(f"(force: ms past cancel_requested + grace {FORCE_GRACE}s; times in ms)")
    return goals(spawn, stop)


def verdict(value: float, goal: float) -> str:
    return "MET" if value <= goal else "NOT MET"


def goals(spawn: dict[str, dict[str, float]], stop: dict[str, Any]) -> list[str]:
    broken = []
    lines = []
    for name, r in stop.items():
        c, f = r["cooperative_ms"]["p99"], r["force_overshoot_ms"]["p99"]
        coop, force = GOALS["cooperative_ms"], GOALS["force_overshoot_ms"]
        lines.append(f"{name}: cooperative p99 {c:.1f} ms (<= {coop:.0f}): {verdict(c, coop)}")
        lines.append(
            f"{name}: force overshoot p99 {f:.1f} ms (<= {force:.0f}): {verdict(f, force)}"
        )
        lines.append(f"{name}: survivors {r['survivors']} (= 0): {verdict(r['survivors'], 0)}")
        if r["survivors"]:
            broken.append(f"{name}: {r['survivors']} process(es) survived a stop")
    if "bwrap-warm" in spawn:
        ratio = spawn["bwrap-warm"]["ratio_to_bare"]
        goal = GOALS["warm_ratio"]
        lines.append(f"bwrap warm spawn {ratio:.2f}x bare (<= {goal:g}): {verdict(ratio, goal)}")
    if "docker-warm" in spawn:
        p50, goal = spawn["docker-warm"]["p50"], GOALS["warm_ms"]
        lines.append(f"docker warm exec p50 {p50:.1f} ms (<= {goal:g}): {verdict(p50, goal)}")
    print("\ngoals:\n  " + "\n  ".join(lines))
    print(f"load average at the end: {os.getloadavg()}")
    return broken


async def main_async(args: argparse.Namespace) -> int:
    rounds, per_round, n = (1, 5, 5) if args.quick else (args.rounds, 20, args.stops)
    with tempfile.TemporaryDirectory(prefix="eg-bench-cancel-") as tmp_name:
        tmp = Path(tmp_name)
        env = environment(tmp)
        print(f"cancel bench: {env['cpus']} cpus, load {env['loadavg_at_start']}")
        spawn, docker = await spawn_costs_all(tmp, rounds, per_round)
        variants = ["process", "bwrap-warm", "bwrap-cold"] if "bwrap-warm" in spawn else ["process"]
        variants += ["docker", "docker-warm"] if docker else []
        stop = await measure_stops(tmp, variants, n)
        broken = report(spawn, stop)
        env["loadavg_at_end"] = os.getloadavg()
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps({"env": env, "spawn": spawn, "stops": stop}, indent=2))
    for line in broken:
        print("BROKEN:", line, file=sys.stderr)
    return 1 if broken else 0


async def spawn_costs_all(
    tmp: Path, rounds: int, per_round: int
) -> tuple[dict[str, dict[str, float]], bool]:
    """Every backend's spawn cost; whether docker was measured."""
    workspace = tmp / "ws"
    workspace.mkdir()
    cgroups = CgroupRoot("bench-" + uuid.uuid4().hex[:8])
    group = cgroups if cgroups.available else None
    cases: dict[str, Callable[[], Awaitable[None]]] = {
        "bare": bare_spawn,
        "process": sandbox_spawn(ProcessSandbox(group), workspace),
    }
    opened: list[Sandbox] = []
    cold, warm = BwrapSandbox(group), WarmBwrapSandbox(group)
    if cold.probe().ok:
        cases["bwrap-cold"] = sandbox_spawn(cold, workspace)
        if "warm mode" in warm.probe().detail:
            cases["bwrap-warm"] = sandbox_spawn(warm, workspace)
            opened.append(warm)
        # bubblewrap alone, same arguments, none of execgate's machinery around it.
        raw = bwrap_argv(Launch(**LAUNCH, cwd=workspace, workspace=workspace, marker="m"))
        cases["bwrap-alone"] = lambda: bare_spawn(*raw)
    cases.update(docker_cases(workspace, opened))
    try:
        return await spawn_costs(cases, rounds, per_round), "docker-cold" in cases
    finally:
        for sandbox in opened:
            await sandbox.close()
        remove_root(cgroups)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved spawn rounds")
    parser.add_argument("--stops", type=int, default=30, help="cancels per kind per backend")
    try:
        return asyncio.run(main_async(parser.parse_args()))
    except BenchError as exc:
        print(f"BROKEN: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
