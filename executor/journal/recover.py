"""Recovery at startup: what calls a stopped daemon left running are, once it is back.

Every `running` row becomes UNKNOWN_OUTCOME/interrupted (a call that may write) or
FAILURE/interrupted (read-only), with a `recovered` mark; see docs/architecture.md.
"""

from __future__ import annotations

import sqlite3

from execgate.executor.core import clock
from execgate.executor.core.outcomes import ErrorClass, Mark, Outcome, Phase, Status, StopMode

from .codec import outcome_to_json


def interrupted_outcome(may_write: bool, created_at: float) -> Outcome:
    """What a call left running by a stopped daemon is, once the daemon is back."""
    now = clock.now()
    timeline = (Mark(Phase.STARTED, created_at), Mark(Phase.RECOVERED, now, "daemon restarted"))
    if may_write:
        status = Status.UNKNOWN_OUTCOME
        message = (
            "the daemon stopped while this call was running; it may or may not have "
            "taken effect: reconcile (read back) before retrying"
        )
    else:
        status = Status.FAILURE
        message = (
            "the daemon stopped while this read-only call was running; nothing changed, "
            "it is safe to retry"
        )
    return Outcome(
        status=status,
        error_class=ErrorClass.INTERRUPTED,
        message=message,
        timeline=timeline,
        stopped_how=StopMode.INTERRUPTED,
    )


def recover_running(conn: sqlite3.Connection) -> int:
    rows = conn.execute(
        "SELECT seq, may_write, created_at FROM calls WHERE state='running'"
    ).fetchall()
    now = clock.now()
    for seq, may_write, created_at in rows:
        outcome = interrupted_outcome(bool(may_write), created_at)
        conn.execute(
            "UPDATE calls SET state='finished', finished_at=?, status=?, outcome_json=? "
            "WHERE seq=?",
            (now, outcome.status.value, outcome_to_json(outcome), seq),
        )
    return len(rows)
