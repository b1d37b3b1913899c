"""What a call is doing, as MCP progress notifications.

Only a request that carries a progress token gets them (the spec's rule). Each call's
notifications carry strictly increasing `progress` values, as MCP requires: a count of
the notifications sent for it, since execgate's own stages (waiting for a lock, for an
approval, running) have no common scale with a tool's progress. The tool's own
figures, when it reports any, are in the message (`running: 3/10 downloading`), and
`total` is never set.

While the call waits (for locks, for an approver) the bridge says so again every
`heartbeat` seconds, so a client whose request timeout is reset by progress keeps
waiting for the human.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from ..types import Event, EventKind

__all__ = ["Teller"]


class Teller:
    """The progress messages of one call."""

    def __init__(self) -> None:
        # How many notifications were sent: the next one's `progress` is this plus 1.
        self.sent = 0
        # What the call waits for now ("" while it runs or before it waits).
        self.waiting = ""
        self._waited = False

    def tell(self, event: Event, approvers: Sequence[str] = ()) -> str | None:
        """The message for `event`, or None when it is not worth a notification (queued,
        started without having waited, finished: the result follows)."""
        match event.kind:
            case EventKind.WAITING:
                behind = ", ".join(event.blocked_by) or "earlier calls"
                on = ", ".join(event.keys) or "a resource"
                self.waiting = f"waiting for {behind} (on {on})"
                return self._waits()
            case EventKind.AWAITING_APPROVAL:
                self.waiting = _approval(event, approvers)
                return self._waits()
            case EventKind.STARTED if self._waited:
                self.waiting = ""
                return "running"
            case EventKind.PROGRESS:
                of = f"/{event.total:g}" if event.total else ""
                said = f" {event.progress_message}" if event.progress_message else ""
                return f"running: {event.progress:g}{of}{said}"
            case _:
                return None

    def step(self) -> float:
        """The `progress` value of the next notification (1, 2, 3, ...)."""
        self.sent += 1
        return float(self.sent)

    def still(self, seconds: float) -> str | None:
        """The heartbeat while waiting, None while not."""
        return f"still {self.waiting} ({seconds:.0f} s)" if self.waiting else None

    def _waits(self) -> str:
        self._waited = True
        return self.waiting


def _approval(event: Event, approvers: Sequence[str]) -> str:
    who = f"; approvers: {', '.join(approvers)}" if approvers else ""
    until = ""
    if event.expires_at is not None:
        at = datetime.datetime.fromtimestamp(event.expires_at, datetime.UTC)
        until = f"; expires {at:%Y-%m-%d %H:%M:%S} UTC"
    return (
        f"waiting for approval {event.approval_id} by an operator "
        f"(rule {event.rule_id}: {event.reason}{who}{until}; "
        f"`execgate approvals approve {event.approval_id}`)"
    )
