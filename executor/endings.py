"""How a call ends without running its tool: refused, a duplicate id, or a replay.

Each is recorded in the journal before its FINISHED event is sent, like every
outcome (a refusal whose call id is taken goes to the `refusals` table instead,
so the original row is never overwritten).
"""

from __future__ import annotations

import time
from dataclasses import replace

from .calls import CallRequest, ValidCall
from .events import Batch, EventKind
from .idempotency import Replay
from .journal import CallRecord, DuplicateCall, Journal, PolicyRecord
from .outcomes import ErrorClass, Mark, Outcome, Phase, mark, rejected


class Endings:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    async def reject(
        self,
        req: CallRequest,
        batch: Batch,
        outcome: Outcome,
        decision: PolicyRecord | None = None,
    ) -> None:
        outcome = outcome.with_marks(mark(Phase.FINISHED))
        rec = record(req, batch.agent, "", False, outcome.timeline[0].at)
        rec = replace(rec, decision=decision)
        # A refused call never claimed its idempotency key (for a conflict, another
        # call owns it): recording the key here would bind it to a call that never
        # ran, and break the unique (agent, key) index.
        rec = replace(rec, idempotency_key="")
        try:
            await self.journal.record_finished(rec, outcome)
        except DuplicateCall:
            await self.journal.record_refusal(rec, outcome)
        batch.emit(EventKind.FINISHED, req, outcome=outcome)

    async def refuse_duplicate(self, req: CallRequest, batch: Batch, queued: Mark) -> Outcome:
        outcome = rejected(
            ErrorClass.DUPLICATE_CALL_ID,
            f"call_id {req.call_id!r} is already used in run {req.run_id!r}; "
            "use GetCall to read that call",
            "call_id",
        ).with_marks(queued, mark(Phase.FINISHED))
        rec = record(req, batch.agent, "", False, queued.at)
        await self.journal.record_refusal(rec, outcome)
        batch.emit(EventKind.FINISHED, req, outcome=outcome)
        return outcome

    async def replay(self, call: ValidCall, batch: Batch, replay: Replay) -> None:
        req = call.request
        outcome, original = replay.outcome, replay.call_id
        if (replay.run_id, replay.call_id) == (req.run_id, req.call_id):
            # The very same call resent (a client retrying its batch): report, add nothing.
            batch.emit(EventKind.FINISHED, req, outcome=outcome, replay_of=original)
            return
        rec = record(req, batch.agent, call.request_hash, call.may_write, time.time())
        rec = replace(rec, idempotency_key="", replay_of=original)
        try:
            await self.journal.record_finished(rec, outcome)
        except DuplicateCall:
            await self.refuse_duplicate(req, batch, mark(Phase.QUEUED))
            return
        batch.emit(EventKind.FINISHED, req, outcome=outcome, replay_of=original)


def record(
    req: CallRequest, agent: str, request_hash: str, may_write: bool, created_at: float
) -> CallRecord:
    return CallRecord(
        run_id=req.run_id,
        call_id=req.call_id,
        batch_id=req.batch_id,
        tool=req.tool,
        arguments_json=req.arguments_json,
        request_hash=request_hash,
        idempotency_key=req.idempotency_key,
        agent=agent,
        may_write=may_write,
        created_at=created_at,
    )
