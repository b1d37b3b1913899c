"""`execgate kills [--since 1h] [--run RUN]`: every call the daemon had to force-terminate.

Read from the journal through `ListCalls`: a stopped call is FAILURE or UNKNOWN_OUTCOME,
and it was killed if its timeline has a `force_terminated` mark. For each: why it was
stopped (cancel, timeout, shutdown: its cancel_requested mark), the ladder's times
(requested → SIGTERM → SIGKILL → stopped), the grace it actually had (SIGKILL - SIGTERM),
the survivors the sandbox found afterwards, and its exit code, signal or OOM kill.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from rich.console import Console

from execgate.client import CallRecord, Status
from execgate.executor.cli.trace.rows import StopCause, call_row

from . import common
from . import options as cli_options
from .table import Col, print_table
from .trace import text as words

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# A forced stop ends a call FAILURE (read-only, or a write that proved nothing changed)
# or UNKNOWN_OUTCOME (a write); asking for those two statuses narrows the scan.
STOPPED_STATUSES = (Status.FAILURE, Status.UNKNOWN_OUTCOME)


@dataclass(frozen=True, slots=True, kw_only=True)
class Kill:
    """One forced termination. Times are epoch seconds."""

    run_id: str
    call_id: str
    tool: str
    agent: str
    status: str
    error_class: str
    cause: StopCause
    # The cancel_requested mark's detail: "timeout after 1.5s", "<reason> (requested by X)".
    detail: str
    requested: float
    signal_sent: float | None
    forced: float
    stopped: float | None
    # SIGKILL - SIGTERM: the grace the call actually had.
    grace_used: float | None
    # Processes found alive after the kill (0: none; None: unknown).
    survivors: int | None
    exit_code: int | None
    signal: int | None
    oom_killed: bool | None
    force_how: str


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = cli_options.common()
    p = sub.add_parser("kills", parents=[parent], help="calls the daemon force-terminated, and how")
    p.add_argument(
        "--since",
        type=age,
        default=None,
        metavar="AGE",
        help="only kills this recent: 30s, 15m, 1h, 2d (default: any age)",
    )
    p.add_argument("--run", default="", help="only this run's calls (default: every run)")
    p.add_argument(
        "--limit", type=int, default=1000, help="stopped calls to scan, newest first (default 1000)"
    )
    p.set_defaults(handler=_kills)


def age(text: str) -> float:
    """Seconds in "30s", "15m", "1h", "2d" (an argparse type)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age like 30s, 15m, 1h or 2d")
    return float(m.group(1)) * UNITS[m.group(2)]


def kills(records: Iterable[CallRecord], since: float | None = None) -> list[Kill]:
    """The forced terminations among `records` (killed at or after `since`, epoch)."""
    found = []
    for record in records:
        kill = kill_of(record)
        if kill is not None and (since is None or kill.forced >= since):
            found.append(kill)
    return found


def kill_of(record: CallRecord) -> Kill | None:
    row = call_row(record, 0.0)  # origin 0: the row keeps epoch times
    lad = row.ladder
    if lad is None or lad.forced is None:
        return None
    return Kill(
        run_id=record.run_id,
        call_id=row.call_id,
        tool=row.tool,
        agent=row.agent,
        status=row.status,
        error_class=row.error_class,
        cause=lad.cause,
        detail=lad.detail,
        requested=lad.requested,
        signal_sent=lad.signal,
        forced=lad.forced,
        stopped=lad.stopped,
        grace_used=lad.grace_used,
        survivors=row.survivors,
        exit_code=row.exit_code,
        signal=row.signal,
        oom_killed=row.oom_killed,
        force_how=lad.force_how,
    )


def _kills(args: argparse.Namespace) -> int:
    since = time.time() - args.since if args.since is not None else None
    with common.client(args) as client:
        # The daemon keeps only calls finished inside the window (a call created before
        # it may have been killed inside it); here, only those whose SIGKILL was.
        records = client.list_calls(
            run_id=args.run, statuses=STOPPED_STATUSES, limit=args.limit, finished_since=since
        )
    found = kills(records, since)
    if args.json:
        common.print_json([common.jsonable(k) for k in found])
        return 0
    _print_table(found)
    return 0


COLUMNS = (
    Col("call", keep=True, style="bold"),
    Col("run", keep=True),
    Col("status", keep=True),
    Col("survivors", keep=True, justify="right"),
    Col("reason"),
    Col("ladder"),
    Col("grace"),
    Col("exit"),
    Col("tool"),
    Col("requested"),
)


def _print_table(found: list[Kill]) -> None:
    rows = []
    for k in found:
        ladder = [
            f"SIGTERM {_after(k.signal_sent, k.requested)}",
            f"SIGKILL {_after(k.forced, k.requested)}",
            f"stopped {_after(k.stopped, k.requested)}",
        ]
        rows.append(
            [
                k.call_id,
                k.run_id,
                k.status,
                "unknown" if k.survivors is None else str(k.survivors),
                f"{k.cause.value}: {k.detail}",
                "\n".join(ladder),
                words.dur(k.grace_used) if k.grace_used is not None else "?",
                _exit(k),
                f"{k.tool} (agent {k.agent})",
                common.when_short(k.requested),
            ]
        )
    title = f"forced terminations: {len(found)}"
    print_table(Console(highlight=False), COLUMNS, rows, title=title)


def _after(at: float | None, start: float) -> str:
    return "-" if at is None else f"+{words.dur(at - start)}"


def _exit(k: Kill) -> str:
    facts = []
    if k.exit_code is not None:
        facts.append(f"code {k.exit_code}")
    if k.signal is not None:
        facts.append(f"signal {k.signal}")
    if k.oom_killed:
        facts.append("OOM-killed")
    return ", ".join(facts) or "-"
