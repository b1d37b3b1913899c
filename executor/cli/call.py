"""`execgate call TOOL`: one call, its progress on stderr while it waits.

The call goes out on the Execute stream, so the person at the terminal sees what it is
doing: queued, waiting behind other calls (which), parked for an approval (its id, the
rule, who may decide, until when), running for how long. The call id is fixed before
the call is sent, so if the daemon goes away under it the CLI can say which call to
reconcile with `execgate calls show`.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import threading
import time
from typing import Any, TextIO

from rich.console import Console

from execgate.client import (
    Call,
    Client,
    DaemonUnavailable,
    Event,
    EventKind,
    ExecgateClientError,
    Outcome,
    Status,
)

from . import common
from . import lookup as cli_lookup
from . import show as cli_show

EX_UNAVAILABLE = 69


class Progress:
    """What the call is doing: a wait (for locks, for an approval) told on `out` when it
    begins, and whatever the call is doing every `every` seconds after."""

    def __init__(self, out: TextIO, call_id: str, run_id: str, every: float) -> None:
        self._out = out
        self._call_id = call_id
        self._run_id = run_id
        self._every = every
        # What the call is doing now ("queued", "running", ...) and since when.
        self.state = "sent"
        self._since = time.monotonic()
        self._done = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self) -> Progress:
        if self._every > 0:
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._ticker.is_alive():
            self._ticker.join()

    def say(self, text: str) -> None:
        print(f"execgate: {self._call_id}: {text}", file=self._out, flush=True)

    def event(self, e: Event, client: Client, call: Call) -> None:
        self._since = time.monotonic()
        match e.kind:
            case EventKind.QUEUED:  # told by the ticker if it lasts: a quick call is quiet
                self.state = f"queued in run {self._run_id}"
            case EventKind.WAITING:
                self.state = "waiting for a lock"
                behind = ", ".join(e.blocked_by) or "earlier calls"
                self.say(f"queued behind {behind} (on {', '.join(e.keys) or 'a resource'})")
            case EventKind.AWAITING_APPROVAL:
                self.state = f"waiting for approval {e.approval_id}"
                until = f", expires {cli_show_time(e.expires_at)}" if e.expires_at else ""
                who = _deciders(client, call, self._run_id)
                self.say(
                    f"waiting for approval {e.approval_id} (rule {e.rule_id}: {e.reason}); "
                    f"who can decide: {who}{until}; "
                    f"`execgate approvals approve {e.approval_id}`"
                )
            case EventKind.STARTED:
                self.state = "running"
            case EventKind.PROGRESS:
                of = f"/{e.total:g}" if e.total else ""
                said = f": {e.progress_message}" if e.progress_message else ""
                self.state = f"running ({e.progress:g}{of}{said})"
            case EventKind.FINISHED:
                self.state = "finished"

    def _tick(self) -> None:
        while not self._done.wait(self._every):
            if self.state in ("sent", "finished"):
                continue
            self.say(f"{self.state} for {time.monotonic() - self._since:.0f} s")


def cli_show_time(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _deciders(client: Client, call: Call, run_id: str) -> str:
    """Who the policy lets approve this call (Explain); "an approver" if it cannot say."""
    try:
        [plan] = client.explain([call], run_id=run_id)
    except (ExecgateClientError, ValueError):
        return "an approver"
    approvers = plan.policy.approvers if plan.policy is not None else ()
    return ", ".join(approvers) or "an approver"


def run_call(args: argparse.Namespace, client: Client, arguments: dict[str, Any] | str) -> int:
    run_id = args.run or cli_lookup.DEFAULT_RUN
    call = Call(
        tool=args.tool,
        arguments=arguments,
        call_id=args.call_id or f"call_{secrets.token_hex(8)}",
        idempotency_key=args.idempotency_key,
        timeout=args.timeout,
    )
    every = 0.0 if args.quiet else args.progress_every
    outcome: Outcome | None = None
    with Progress(sys.stderr, call.call_id, run_id, every) as progress:
        try:
            for e in client.stream([call], run_id=args.run or None):
                if not args.quiet:
                    progress.event(e, client, call)
                if e.kind is EventKind.FINISHED:
                    outcome = e.outcome
        except DaemonUnavailable as exc:
            progress.say(
                f"the daemon went away while the call was {progress.state} ({exc}); "
                f"its outcome is in the journal: execgate calls show {call.call_id} "
                f"--run {run_id}"
            )
            return EX_UNAVAILABLE
    if outcome is None:
        print(f"execgate: {call.call_id}: the stream ended without an outcome", file=sys.stderr)
        return 1
    if args.json:
        common.print_json({"run_id": run_id, **common.jsonable(outcome)})
    else:
        cli_show.print_outcome(Console(highlight=False), outcome, run_id)
    return 0 if outcome.status is Status.SUCCESS else 1
