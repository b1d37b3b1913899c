"""`execgate serve`: the daemon in the foreground (the only command that imports it)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import replace
from pathlib import Path

from execgate.executor.policy import local_identities
from execgate.executor.server import malloc
from execgate.executor.server.config import ServeConfig, parse_listener
from execgate.executor.tools import Limits

from . import identity as cli_identity
from . import sandbox as cli_sandbox


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _serve_parser(sub)


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the daemon in the foreground")
    p.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="ADDR",
        help="unix:PATH or HOST:PORT; repeatable (default: unix:STATE_DIR/execgate.sock)",
    )
    p.add_argument(
        "--workspace",
        type=Path,
        default=Path("workspace"),
        help="root directory tools work in (default: ./workspace)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path("var"),
        help="journal and socket directory, mode 0700 (default: ./var)",
    )
    p.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="policy file (default: the shipped policies/default.yaml)",
    )
    p.add_argument(
        "--tools",
        type=Path,
        default=None,
        metavar="PATH",
        help="tools file or tools.d/ directory: declared command tools and MCP servers "
        "(reloaded on change; see docs/tools.md)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=Limits().grace,
        help="seconds between SIGTERM and SIGKILL when a call is stopped",
    )
    p.add_argument(
        "--default-timeout",
        type=float,
        default=Limits().default_timeout,
        help="seconds a call may run unless it asks for less",
    )
    p.add_argument(
        "--output-cap",
        type=int,
        default=Limits().output_cap_bytes,
        help="bytes of result text returned to the model",
    )
    p.add_argument(
        "--file-cap",
        type=int,
        default=Limits().file_cap_bytes,
        help="bytes: the largest file the file tools read whole or produce (edit_file); "
        f"default {Limits().file_cap_bytes}",
    )
    p.add_argument(
        "--locks",
        default="inprocess",
        choices=["inprocess", "filelock", "postgresql", "none"],
        help="lock backend: inprocess (default); filelock when several daemons on one host "
        "share a workspace; postgresql when daemons on several hosts do (needs --journal "
        "postgresql://...); none turns scheduling off (tests only, with --test-tools)",
    )
    p.add_argument(
        "--journal",
        default="",
        metavar="URL",
        help="the journal: a postgresql://... URL shared by several daemons (docs/deploy.md; "
        "libpq's PG* variables apply, PGPASSWORD included); default: SQLite in --state-dir",
    )
    p.add_argument(
        "--lease",
        type=float,
        default=10.0,
        help="seconds this daemon's lease in a PostgreSQL journal lasts unrenewed: a daemon "
        "that died is reaped (its calls settled, its locks freed) within about this long",
    )
    p.add_argument(
        "--lock-space",
        default="",
        help="postgresql lock backend: daemons with the same lock space share one lock table "
        "(default: derived from the workspace's real path)",
    )
    p.add_argument(
        "--lock-dir",
        type=Path,
        default=None,
        help="filelock backend directory (default: per workspace, ~/.cache/execgate)",
    )
    p.add_argument("--reflection", action="store_true", help="serve gRPC server reflection")
    p.add_argument(
        "--test-tools",
        action="store_true",
        help="also serve the probe tools `noop` and `work` (tests and bench/)",
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="permit plaintext (non-TLS) TCP listeners on non-loopback addresses",
    )
    cli_identity.add_serve_args(p)
    cli_sandbox.add_serve_args(p)
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    p.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    malloc.pin_mmap_threshold()  # big transient buffers go back to the OS (malloc.py)
    limits = replace(
        Limits(),
        grace=args.grace,
        default_timeout=args.default_timeout,
        output_cap_bytes=args.output_cap,
        file_cap_bytes=args.file_cap,
    )
    config = ServeConfig(
        state_dir=args.state_dir,
        workspace=args.workspace,
        listen=tuple(parse_listener(a) for a in args.listen),
        policy=args.policy,
        tools=args.tools,
        limits=limits,
        reflection=args.reflection,
        test_tools=args.test_tools,
        allow_remote=args.allow_remote,
        identities=cli_identity.identities_file(args),
        tls=cli_identity.tls_files(args),
        locks=args.locks,
        lock_dir=args.lock_dir,
        journal=args.journal,
        lease=args.lease,
        lock_space=args.lock_space,
        sandbox=cli_sandbox.config_from(args),
    )

    def ready(addresses: list[str]) -> None:
        print(
            f"execgate listening on {', '.join(addresses)} "
            f"(workspace {config.workspace.resolve()}, journal {journal_where(config)})",
            flush=True,
        )
        if args.local_identities:
            tokens = local_identities.tokens_dir(config.state_dir).resolve()
            print(
                f"identities: agent and operator, tokens in {tokens} "
                "(the CLI uses them: `execgate call` as agent, `execgate approvals` as operator)",
                flush=True,
            )

    from execgate.executor.server.serve import journal_where, serve

    return asyncio.run(serve(config, on_ready=ready))
