"""How a call ends without running its tool: refused, a duplicate id, or a replay.

Each is recorded in the journal before its FINISHED event is sent, like every
outcome (a refusal whose call id is taken goes to the `refusals` table instead,
so the original row is never overwritten).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from execgate.executor.core import clock
from execgate.executor.core.outcomes import ErrorClass, Mark, Outcome, Phase, mark, rejected
from execgate.executor.journal.base import CallStore
from execgate.executor.journal.store import CallRecord, DuplicateCall, PolicyRecord

from . import results
from .calls import Approved, CallRequest, Reached, ValidCall
from .events import Batch, EventKind
from .idempotency import Replay

log = logging.getLogger("execgate.dispatch")


class Endings:
    def __init__(self, journal: CallStore) -> None:
        self.journal = journal

    async def reject(
        self,
        req: CallRequest,
        batch: Batch,
        outcome: Outcome,
        decision: PolicyRecord | None = None,
        reached: Reached = None,
    ) -> None:
        """Record and report a call refused before it started. `decision` goes into its
        journal row; `reached`, the furthest stage record, into its trace."""
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
        batch.emit(EventKind.FINISHED, req, outcome=outcome, reached=reached)

    async def crashed(
        self,
        req: CallRequest,
        batch: Batch,
        queued: Mark,
        exc: Exception,
        reached: Reached = None,
        *,
        started: bool = False,
    ) -> None:
        """A bug inside the daemon ended the call. It is recorded as what can be vouched
        for (results.from_crash) and journaled before it is reported; if even the journal
        fails, nothing is reported as an outcome and the RPC ends INTERNAL instead."""
        log.exception("call %s failed inside the daemon", req.call_id)
        may_write = started and (reached is None or reached.valid.may_write)
        outcome = results.from_crash(
            exc, started=started, may_write=may_write, marks=(queued, mark(Phase.FINISHED))
        )
        try:
            if not started:
                await self.reject(req, batch, outcome, decided(reached), reached)
                return
            try:
                await self.journal.record_outcome(
                    req.run_id, req.call_id, outcome, "", durable=may_write
                )
            except DuplicateCall:  # its real outcome was journaled before the bug hit
                found = await self.journal.get(req.run_id, req.call_id)
                if found is None or found.outcome is None:
                    raise
                outcome = found.outcome
        except Exception:
            log.exception("call %s: its outcome could not be journaled", req.call_id)
            batch.emit(EventKind.UNRECORDED, req)
            return
        batch.emit(EventKind.FINISHED, req, outcome=outcome, reached=reached)

    async def refuse_duplicate(
        self, req: CallRequest, batch: Batch, queued: Mark, reached: Reached = None
    ) -> Outcome:
        outcome = rejected(
            ErrorClass.DUPLICATE_CALL_ID,
            f"call_id {req.call_id!r} is already used in run {req.run_id!r}; "
            "use GetCall to read that call",
            "call_id",
        ).with_marks(queued, mark(Phase.FINISHED))
        rec = record(req, batch.agent, "", False, queued.at)
        await self.journal.record_refusal(rec, outcome)
        batch.emit(EventKind.FINISHED, req, outcome=outcome, reached=reached)
        return outcome

    async def replay(
        self, call: ValidCall, batch: Batch, replay: Replay, reached: Reached = None
    ) -> None:
        req = call.request
        outcome, original = replay.outcome, replay.call_id
        if (replay.run_id, replay.call_id) == (req.run_id, req.call_id):
            # The very same call resent (a client retrying its batch): report, add nothing.
            batch.emit(
                EventKind.FINISHED, req, outcome=outcome, replay_of=original, reached=reached
            )
            return
        rec = record(req, batch.agent, call.request_hash, call.may_write, clock.now())
        rec = replace(rec, idempotency_key="", replay_of=original)
        try:
            await self.journal.record_finished(rec, outcome)
        except DuplicateCall:
            await self.refuse_duplicate(req, batch, mark(Phase.QUEUED), reached)
            return
        batch.emit(EventKind.FINISHED, req, outcome=outcome, replay_of=original, reached=reached)


def decided(reached: Reached) -> PolicyRecord | None:
    """The policy decision a call reached, as its journal row keeps it."""
    if reached is None:
        return None
    authorized = reached.authorized if isinstance(reached, Approved) else reached
    return authorized.record


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
        # The workspace it worked in once chosen (pinned on the request), else the one
        # the request named ("": none) -- a call refused for its workspace keeps that.
        workspace=req.workspace,
    )
