"""Idempotency.claim on a fake journal: a retry checked against what the journal recorded."""

from __future__ import annotations

import asyncio
from typing import Any

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Outcome
from execgate.executor.core.outcomes import Status as DStatus
from execgate.executor.journal.store import CallRecord
from execgate.executor.pipeline.idempotency import Idempotency

# ---------------------------------------------------------------------------------------
# BUG 4: idempotency.claim: while the owner reads the journal, a retry whose request
# matches the *recorded* call is checked against the in-flight owner's hash instead and
# is REJECTED as a conflict (a legitimate replay refused).


class _SlowJournal:
    def __init__(self, recorded: CallRecord) -> None:
        self.recorded = recorded
        self.go = asyncio.Event()

    async def by_idempotency_key(self, agent: str, key: str) -> CallRecord | None:
        await self.go.wait()
        return self.recorded


def test_idempotency_replay_refused_while_conflicting_owner_reads_journal() -> None:
    recorded = CallRecord(
        run_id="r",
        call_id="orig",
        batch_id="b",
        tool="noop",
        arguments_json="{}",
        request_hash="H0",
        idempotency_key="K",
        agent="a",
        may_write=False,
        created_at=0.0,
        outcome=Outcome(status=DStatus.SUCCESS),
    )

    async def body() -> tuple[Any, Any]:
        journal = _SlowJournal(recorded)
        idem = Idempotency(journal)  # type: ignore[arg-type]
        wrong = asyncio.ensure_future(idem.claim("a", "K", "H1", "r", "c1"))  # a different request
        await asyncio.sleep(0)
        right = asyncio.ensure_future(idem.claim("a", "K", "H0", "r", "c2"))  # a true retry
        await asyncio.sleep(0)
        journal.go.set()
        return tuple(await asyncio.gather(wrong, right, return_exceptions=True))  # type: ignore[return-value]

    wrong, right = asyncio.run(body())
    assert isinstance(wrong, ToolError)
    assert wrong.error_class is ErrorClass.IDEMPOTENCY_CONFLICT
    # The retry matches what the journal recorded under K: it must be a replay.
    assert not isinstance(right, BaseException), right
    assert right.call_id == "orig"
