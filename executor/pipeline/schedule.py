"""Schedule: an approved call passes its agent's quotas, waits for its locks, is
journaled as started, runs, and its outcome is journaled, then reported.

The intent is written only once the locks are granted, just before the tool starts:
a call still queued when the daemon dies has no row and is known never to have
started, so recovery never calls it UNKNOWN_OUTCOME. The lock queue is fair between
agents (locks.decide: each agent is a flow) and holds a call past its agent's
concurrent-call cap; the policy's other quotas are applied before it (quota.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Mark, Outcome, Phase, mark, rejected
from execgate.executor.journal.base import CallStore
from execgate.executor.journal.records import CallRecord, DuplicateCall, Durable
from execgate.executor.locks import Abandoned, LockBackend, WaitInfo
from execgate.executor.policy import Quota
from execgate.executor.tools import CancelScope

from . import results
from .calls import Approved, Authorized, CallRequest
from .endings import Endings, record
from .events import Batch, EventKind
from .inflight import Active
from .quota import Quotas, Ticket
from .run import Runner


class Scheduler:
    def __init__(
        self,
        journal: CallStore,
        locks: LockBackend,
        endings: Endings,
        runner: Runner,
        quota_for: Callable[[Authorized], Quota],
    ) -> None:
        self.journal = journal
        self._locks = locks
        self._endings = endings
        self._runner = runner
        # The policy in force's `quotas:` for a call's agent (reloads swap the policy).
        self._quota_for = quota_for
        self._quotas = Quotas()

    async def schedule(
        self, approved: Approved, batch: Batch, active: Active, queued: Mark
    ) -> Outcome:
        """Pass the agent's quotas, then run the call under its locks (`_locked`)."""
        placed = self._placed(approved)
        quota = self._quota_for(placed.authorized)
        try:
            ticket = self._quotas.admit(batch.agent, quota)
        except ToolError as err:  # over a quota: refused, journaled first
            outcome = results.from_error(err, (queued,))
            await self._endings.reject(placed.request, batch, outcome, reached=placed)
            return outcome
        admitted = _Admitted(quota, ticket, WIDENED if placed is not approved else "")
        try:
            return await self._locked(placed, batch, active, queued, admitted)
        finally:
            ticket.end()

    async def _locked(
        self,
        approved: Approved,
        batch: Batch,
        active: Active,
        queued: Mark,
        admitted: _Admitted,
    ) -> Outcome:
        """Wait for the rate slot and the locks, journal the intent, run, journal the
        outcome, report it."""
        req, scope = approved.request, active.scope
        quota, ticket = admitted.quota, admitted.ticket
        waited: list[Mark] = []
        try:
            if ticket.delay > 0:
                waited.append(mark(Phase.WAITING, _paced(quota)))
            if not await ticket.pace(scope.requested):
                raise Abandoned(owner(req))
            lease = await self._locks.acquire(
                owner(req),
                approved.valid.lock_plan,
                cancel=scope.requested,
                on_wait=lambda info: self._waiting(req, batch, info, waited, quota),
                flow=batch.agent,
                cap=quota.cap,
            )
            ticket.start()
            batch.pass_turn(req.index)
            async with lease:  # released on every exit path, a crashing tool included
                marks = (queued, *waited, mark(Phase.LOCK_GRANTED, admitted.granted))
                if scope.requested.is_set():
                    raise Abandoned(owner(req))
                if _gated(approved):
                    outcome, raw = await self._overlapped(approved, batch, active, queued, marks)
                else:
                    await self._intent(approved, queued, active)
                    outcome, raw = await self._started(approved, batch, scope, marks)
        except Abandoned:
            return await self._abandoned(approved, batch, scope, (queued, *waited))
        except DuplicateCall:
            return await self._endings.refuse_duplicate(req, batch, queued, approved)
        return await self._recorded(approved, batch, queued, outcome, raw)

    def _placed(self, approved: Approved) -> Approved:
        """A command's declared effects are its locks only where its sandbox enforces
        them; elsewhere (`process`) it takes the whole workspace."""
        valid = approved.valid
        if valid.effects.confined is None:
            return approved
        placed = valid.placed(self._runner.confines(valid, approved.authorized.policy_input))
        if placed is valid:
            return approved
        return replace(approved, authorized=replace(approved.authorized, valid=placed))

    async def _recorded(
        self, approved: Approved, batch: Batch, queued: Mark, outcome: Outcome, raw: str
    ) -> Outcome:
        """The outcome journaled, then reported: one nobody can find later is never sent."""
        req = approved.request
        try:
            await self.journal.record_outcome(
                req.run_id, req.call_id, outcome, raw, durable=approved.valid.may_write
            )
        except DuplicateCall:  # a read-only call whose id was taken: it changed nothing
            return await self._endings.refuse_duplicate(req, batch, queued, approved)
        batch.emit(EventKind.FINISHED, req, outcome=outcome, reached=approved)
        return outcome

    def _waiting(
        self, req: CallRequest, batch: Batch, info: WaitInfo, waited: list[Mark], quota: Quota
    ) -> None:
        """Called once the call is in the lock queue behind others (or its agent's cap)."""
        batch.pass_turn(req.index)
        keys = tuple(k.render() for k in info.keys)
        behind = list(info.blockers)
        if info.capped and quota.concurrent is not None:
            behind.append(f"its agent's {info.capped} running calls ({quota.concurrent.field})")
        waited.append(mark(Phase.WAITING, "behind " + ", ".join(behind)))
        batch.emit(EventKind.WAITING, req, waiting=(keys, info.blockers))

    async def _intent(self, approved: Approved, queued: Mark, active: Active) -> None:
        """Journal that the call starts (a writer's durably), then mark it started."""
        rec = _intent_record(approved, active, queued)
        if approved.valid.may_write:
            await self.journal.record_intent(rec)
        else:
            self.journal.record_intent_nowait(rec)
        active.started = True

    async def _started(
        self,
        approved: Approved,
        batch: Batch,
        scope: CancelScope,
        marks: tuple[Mark, ...],
    ) -> tuple[Outcome, str]:
        if scope.requested.is_set():  # cancelled while its intent was written
            why = ErrorClass.TIMEOUT if scope.timed_out else ErrorClass.CANCELLED
            outcome = rejected(why, f"stopped before it started: {scope.reason}", "")
            return outcome.with_marks(*marks, mark(Phase.CANCEL_REQUESTED)), ""
        started = mark(Phase.STARTED)
        batch.emit(EventKind.STARTED, approved.request)
        progress = batch.progress_of(approved.request)
        return await self._runner.run(
            approved, batch.deadline, scope, (*marks, started), progress, batch.trace
        )

    async def _overlapped(
        self,
        approved: Approved,
        batch: Batch,
        active: Active,
        queued: Mark,
        marks: tuple[Mark, ...],
    ) -> tuple[Outcome, str]:
        """A gated tool, started while its durable intent is written: the tool prepares
        what nobody can see, and its `before_effect` waits for the intent (in its
        worker thread, woken by the journal's writer) before anything becomes
        visible. STARTED is sent once the intent is journaled, as on the other path.
        Raises DuplicateCall when the intent could not land (the tool then changed
        nothing, and its outcome is not the call's)."""
        req = approved.request
        intent = self.journal.begin_intent(_intent_record(approved, active, queued))
        active.started = True

        async def journaled() -> None:
            await intent.done()
            batch.emit(EventKind.STARTED, req)

        run = self._runner.run(
            approved,
            batch.deadline,
            active.scope,
            (*marks, mark(Phase.STARTED)),
            batch.progress_of(req),
            batch.trace,
            before_effect=functools.partial(_wait_intent, intent),
        )
        landed, ran = await asyncio.gather(journaled(), run, return_exceptions=True)
        for result in (landed, ran):  # the intent's failure first: it decides
            if isinstance(result, BaseException):
                raise result
        assert not isinstance(ran, BaseException)
        return ran

    async def _abandoned(
        self, approved: Approved, batch: Batch, scope: CancelScope, marks: tuple[Mark, ...]
    ) -> Outcome:
        """Stopped while it waited for its locks (or as they were granted)."""
        why = ErrorClass.TIMEOUT if scope.timed_out else ErrorClass.CANCELLED
        outcome = rejected(why, f"stopped before it started: {scope.reason}", "")
        outcome = outcome.with_marks(*marks, mark(Phase.CANCEL_REQUESTED, scope.reason))
        await self._endings.reject(approved.request, batch, outcome, reached=approved)
        return outcome


def _gated(approved: Approved) -> bool:
    """May this call start before its durable intent is committed? Only a writing call
    of a tool that shows nothing before `before_effect` (ToolSpec.gated)."""
    return approved.valid.may_write and approved.valid.tool.spec.gated


def _intent_record(approved: Approved, active: Active, queued: Mark) -> CallRecord:
    call, req = approved.valid, approved.request
    rec = record(req, active.batch.agent, call.request_hash, call.may_write, queued.at)
    return replace(rec, decision=approved.authorized.record)


def _wait_intent(intent: Durable) -> None:
    """ToolContext.before_effect of a call started while its intent is written."""
    try:
        intent.wait()
    except Exception as exc:  # DuplicateCall or a journal failure: the scheduler reports it
        raise ToolError(
            ErrorClass.INTERNAL, f"the call's intent could not be journaled: {exc}"
        ) from exc


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A call past its agent's quotas, as it goes to the lock queue."""

    quota: Quota
    ticket: Ticket
    # The lock_granted mark's detail ("": nothing to say).
    granted: str = ""


# Why a command that declared its paths locked the whole workspace.
WIDENED = "the whole workspace: this sandbox cannot enforce the declared paths"


def _paced(quota: Quota) -> str:
    rate = quota.per_second
    assert rate is not None  # only a rate makes a call wait before the lock queue
    return f"paced to {rate.value:g} calls per second ({rate.field})"


def owner(req: CallRequest) -> str:
    """How a call is named in the lock table and in WAITING events."""
    return f"{req.run_id}/{req.call_id}"
