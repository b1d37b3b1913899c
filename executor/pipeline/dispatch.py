"""The call pipeline: validate, authorize, approve, idempotency, schedule, intent, run,
record, report.

One `Dispatcher` serves every Execute stream. Each call of a batch runs as its
own task owned by the dispatcher (not by the RPC), so a client that disconnects
does not interrupt a call that already started: it finishes and is recorded.
Calls of that batch still queued are REJECTED (cancelled) instead.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Coroutine, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Mark, Outcome, Phase, mark, rejected
from execgate.executor.core.paths import Workspace
from execgate.executor.journal.base import JournalStore
from execgate.executor.journal.store import DuplicateCall
from execgate.executor.locks import Abandoned, LockBackend, WaitInfo
from execgate.executor.policy import Decision, Policy
from execgate.executor.sandbox.registry import Sandboxes
from execgate.executor.tools import CancelScope, Limits, Tool

from . import admission, resend, results
from .approve import Approval, Approvals, Detached
from .authorize import Authorizer
from .calls import CallRequest, ValidCall
from .endings import Endings, record
from .events import ENDS, Batch, Event, EventKind, PlanRow
from .explain import plan
from .idempotency import Idempotency
from .inflight import Active, CancelOrder, InFlight
from .runtool import call_limits, run_tool
from .telemetry import CallTelemetry
from .validate import Validator

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("execgate.dispatch")


class Dispatcher:
    def __init__(
        self,
        *,
        tools: dict[str, Tool],
        journal: JournalStore,
        policy: Policy,
        workspace: Workspace,
        limits: Limits,
        locks: LockBackend,
        sandboxes: Sandboxes,
    ) -> None:
        self.tools = tools
        self.journal = journal
        # Decides each call under the policy in force (reloads swap `policy`).
        self.authorizer = Authorizer(policy, workspace)
        self.workspace = workspace
        self.limits = limits
        self._validator = Validator(tools, workspace, limits)
        self._idempotency = Idempotency(journal)
        self._endings = Endings(journal)
        self._locks = locks
        self.sandboxes = sandboxes
        self._root = str(workspace.root)
        # Invariant: every task here is a call that has not yet recorded its outcome.
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight = InFlight(journal.cancels, journal.runs)
        self.approvals = Approvals(journal.approvals)
        self._active = self._inflight.calls
        # Set by close(): calls that arrive afterwards are REJECTED, never started.
        self._closing = False
        # Runs that reached a terminal state (runs.RunStore.ended): no call of theirs
        # starts. Set by the server.
        self.ended_runs: dict[str, str] = {}
        # Runs started through Runs.StartRun, and who owns each: nobody else's calls join.
        self.run_owners: dict[str, str] = {}
        # Spans and metrics of batches and calls (exporters set by the server).
        self.telemetry = CallTelemetry(self._active, self._root)
        self._id_prefix = secrets.token_hex(6) + "_"
        self._ids = itertools.count(1)

    # -- the public surface ---------------------------------------------------------

    async def execute(
        self,
        run_id: str,
        batch_id: str,
        calls: list[CallRequest],
        agent: str,
        *,
        progress: bool = True,
        deadline: float | None = None,
        metadata: Sequence[tuple[str, Any]] = (),
    ) -> AsyncGenerator[Event, None]:
        """Start every call of the batch and yield their events until all have finished.

        `deadline` (wall clock): calls not started by then are REJECTED (timeout);
        running ones are stopped by their own timeout, which is cut to it.
        """
        batch = Batch(run_id, batch_id, agent, progress, deadline=deadline)
        batch.start_turns(len(calls))
        span = self.telemetry.attach(batch, metadata, len(calls))
        timer = None
        if deadline is not None:
            timer = asyncio.get_running_loop().call_later(
                max(deadline - time.time(), 0),
                lambda: self._inflight.abandon(batch, "run deadline passed", timed_out=True),
            )
        for req in calls:
            self._spawn(self._call(req, batch), req)
        remaining = len(calls)
        try:
            while remaining:
                event = await batch.events.get()
                remaining -= event.kind in ENDS
                yield event
        finally:
            if timer is not None:
                timer.cancel()
            if remaining:  # the caller went away: queued calls must not start
                self._inflight.abandon(batch, "client disconnected")
            span.end()

    async def explain(self, calls: list[CallRequest], agent: str) -> list[PlanRow]:
        """The lock plan of a batch, computed exactly as Execute would, running nothing."""
        return await plan(calls, agent, self._validator, self.authorizer)

    async def cancel(self, order: CancelOrder) -> list[str]:
        """Record the request, then ask the targeted calls to stop; returns the ids reached."""
        return await self._inflight.cancel(order)

    def resume_parked(self, pending: list[Approval]) -> int:
        """Park again the calls a previous daemon left awaiting approval (no stream
        follows them: the outcome is recorded, for GetCall). Returns how many."""
        for approval in pending:
            req = approval.request()
            batch = Batch(req.run_id, req.batch_id, approval.requester, progress=False)
            batch.start_turns(1)
            span = self.telemetry.attach(batch, (), 1)  # no caller: a trace of its own
            self._spawn(self._resumed(req, batch, approval, span), req)
        return len(pending)

    async def _resumed(self, req: CallRequest, batch: Batch, parked: Approval, span: Span) -> None:
        try:
            await self._call(req, batch, parked=parked)
        finally:
            span.end()

    async def close(self, reason: str = "daemon shutting down") -> None:
        """Cancel everything in flight (grace, then force) and wait until it is recorded.
        Calls awaiting approval are detached: their approvals stay pending."""
        self._closing = True
        self.approvals.detach()
        self._inflight.cancel_all(reason)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.approvals.close()
        self._locks.close()

    def force(self) -> None:
        """End every grace period now: in-flight calls are killed, and still recorded."""
        self._inflight.force_all("daemon shutting down (forced)")

    def queue_depth(self) -> int:
        """Calls in the daemon that have not started (queued, parked, waiting for locks)."""
        return sum(1 for active in list(self._active.values()) if not active.started)

    def new_id(self, kind: str) -> str:
        """A daemon-assigned call or batch id: unique across restarts, cheap to make."""
        return f"{kind}_{self._id_prefix}{next(self._ids):x}"

    # -- one call ----------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None], req: CallRequest) -> None:
        task = asyncio.create_task(work, name=f"call {req.call_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, req: CallRequest, batch: Batch, parked: Approval | None = None) -> None:
        queued = Mark(Phase.QUEUED, parked.created_at) if parked else mark(Phase.QUEUED)
        batch.emit(EventKind.QUEUED, req)
        try:
            await self._pipeline(req, batch, queued, parked)
        except Detached as detached:
            log.info("call %s stays parked: %s", req.call_id, detached)
            batch.emit(EventKind.DETACHED, req, approval=detached.approval)
        except Exception as exc:
            # A bug before the call was registered (it never started): still an
            # outcome, journaled first, and the daemon keeps serving.
            await self._endings.crashed(req, batch, queued, exc, None)
        finally:
            batch.pass_turn(req.index)  # however it ended, the next call may go

    async def _pipeline(
        self, req: CallRequest, batch: Batch, queued: Mark, parked: Approval | None
    ) -> None:
        key = (req.run_id, req.call_id)
        if key in self._active:  # the same id is in flight (in this batch or another)
            await self._in_flight_duplicate(req, batch, queued)
            return
        # Registered before any await: the first proposal of an id owns it, and a
        # disconnect or cancel reaches the call even while it is being validated.
        scope = CancelScope()
        self._active[key] = Active(scope, batch)
        try:
            try:
                call = await self._validator.validate(req)
                decision = await self._authorize(call, batch, parked)
                self._may_start(req, batch)
                # A call parked before a restart waits for the approval it has.
                ask = parked or decision.ask
                # A re-sent call that already finished is answered, not asked again.
                if parked is None and ask is not None and await self._answered(call, batch):
                    return
                if ask is not None:
                    # Parked before the lock queue: it holds no locks while it waits.
                    active = self._active[key]
                    settled = functools.partial(setattr, active, "approval")
                    on_park = functools.partial(setattr, active, "parked")
                    await self.approvals.gate(
                        call, batch, scope, ask, active.decision, settled, on_park
                    )
                    self._may_start(req, batch)
            except ToolError as err:
                outcome = results.from_error(err, (queued,))
                await self._endings.reject(req, batch, outcome, self._active[key].decision)
                return
            await self._admitted(call, batch, scope, queued)
        except (Detached, asyncio.CancelledError):
            raise
        except Exception as exc:
            # A bug or a journal failure: the call still ends with the outcome that
            # can be vouched for (REJECTED if it never started), journaled first.
            await self._endings.crashed(req, batch, queued, exc, self._active[key])
        finally:
            self._active.pop(key).ended.set()

    @property
    def policy(self) -> Policy:
        return self.authorizer.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.authorizer.policy = policy  # one assignment: a call sees the old or the new

    async def _authorize(self, call: ValidCall, batch: Batch, parked: Approval | None) -> Decision:
        """Decide (the decision kept for the journal), raising if the policy denies; a
        call parked before a restart is decided again, its approval abandoned on deny."""
        active = self._active[(call.request.run_id, call.request.call_id)]
        try:
            return self.authorizer.decide(call, batch.agent, active)
        except ToolError as err:
            if parked is not None:
                await self.approvals.abandon(parked, f"the policy now in force denies it: {err}")
            raise

    def _may_start(self, req: CallRequest, batch: Batch) -> None:
        """Raise the REJECTED ToolError of a call that must not start now."""
        refusal = admission.refusal(
            req.run_id,
            batch,
            closing=self._closing,
            barred=self._inflight.barred,
            owners=self.run_owners,
            ended=self.ended_runs,
        )
        if refusal is not None:
            raise refusal

    async def _answered(self, call: ValidCall, batch: Batch) -> bool:
        return await resend.answered(call, batch, self.journal, self._endings)

    async def _in_flight_duplicate(self, req: CallRequest, batch: Batch, queued: Mark) -> None:
        """A client resending a call that still runs joins it if its idempotency key says
        so (one parked for an approval, or approved since, is followed to its end)."""
        owner = self._active[(req.run_id, req.call_id)]
        if await resend.join_parked(req, batch, owner, self.journal):
            return
        if req.idempotency_key:
            try:
                call = await self._validator.validate(req)
            except ToolError:
                call = None
            if call is not None:
                replay = await self._idempotency.join_in_flight(
                    batch.agent, req.idempotency_key, call.request_hash, req.run_id, req.call_id
                )
                if replay is not None:
                    await self._endings.replay(call, batch, replay)
                    return
        await self._endings.refuse_duplicate(req, batch, queued)

    async def _admitted(
        self, call: ValidCall, batch: Batch, scope: CancelScope, queued: Mark
    ) -> None:
        req = call.request
        # Calls of a batch reach the lock queue in proposal order (Batch.turns).
        await batch.my_turn(req.index)
        if req.idempotency_key:
            try:
                replay = await self._idempotency.claim(
                    batch.agent,
                    req.idempotency_key,
                    call.request_hash,
                    req.run_id,
                    req.call_id,
                    on_join=lambda: batch.pass_turn(req.index),  # a joiner takes no locks
                )
            except ToolError as err:
                await self._endings.reject(req, batch, results.from_error(err, (queued,)))
                return
            if replay is not None:
                await self._endings.replay(call, batch, replay)
                return
        outcome: Outcome | BaseException = RuntimeError("call did not finish")
        try:
            outcome = await self._journaled_run(call, batch, scope, queued)
        finally:
            if req.idempotency_key:
                self._idempotency.release(batch.agent, req.idempotency_key, outcome)

    async def _journaled_run(
        self, call: ValidCall, batch: Batch, scope: CancelScope, queued: Mark
    ) -> Outcome:
        """Wait for the locks, journal the intent, run, journal the outcome, report it.

        The intent is written only once the locks are granted, just before the tool
        starts: a call still queued when the daemon dies has no row and is known
        never to have started, so recovery never calls it UNKNOWN_OUTCOME.
        """
        req = call.request
        waited: list[Mark] = []

        def on_wait(info: WaitInfo) -> None:  # called once it is in the lock queue
            batch.pass_turn(req.index)
            keys = tuple(k.render(self._root) for k in info.keys)
            waited.append(mark(Phase.WAITING, "behind " + ", ".join(info.blockers)))
            batch.emit(EventKind.WAITING, req, waiting=(keys, info.blockers))

        try:
            lease = await self._locks.acquire(
                _owner(req), call.lock_plan, cancel=scope.requested, on_wait=on_wait
            )
            batch.pass_turn(req.index)
            async with lease:  # released on every exit path, a crashing tool included
                granted = mark(Phase.LOCK_GRANTED)
                if scope.requested.is_set():
                    raise Abandoned(_owner(req))
                rec = record(req, batch.agent, call.request_hash, call.may_write, queued.at)
                rec = replace(rec, decision=self._active[(req.run_id, req.call_id)].decision)
                if call.may_write:
                    await self.journal.record_intent(rec)
                else:
                    self.journal.record_intent_nowait(rec)
                self._active[(req.run_id, req.call_id)].started = True
                if scope.requested.is_set():  # cancelled while its intent was written
                    why = ErrorClass.TIMEOUT if scope.timed_out else ErrorClass.CANCELLED
                    outcome = rejected(
                        why, f"stopped before it started: {scope.reason}", ""
                    ).with_marks(queued, *waited, granted, mark(Phase.CANCEL_REQUESTED))
                    raw = ""
                else:
                    started = mark(Phase.STARTED)
                    batch.emit(EventKind.STARTED, req)
                    marks = (queued, *waited, granted, started)
                    outcome, raw = await self._run_tool(call, batch, scope, marks)
        except Abandoned:
            why = ErrorClass.TIMEOUT if scope.timed_out else ErrorClass.CANCELLED
            outcome = rejected(why, f"stopped before it started: {scope.reason}", "")
            outcome = outcome.with_marks(
                queued, *waited, mark(Phase.CANCEL_REQUESTED, scope.reason)
            )
            await self._endings.reject(req, batch, outcome)
            return outcome
        except DuplicateCall:
            return await self._endings.refuse_duplicate(req, batch, queued)
        # Recorded before it is reported: an outcome nobody can find later is never sent.
        try:
            await self.journal.record_outcome(
                req.run_id, req.call_id, outcome, raw, durable=call.may_write
            )
        except DuplicateCall:  # a read-only call whose id was taken: it changed nothing
            return await self._endings.refuse_duplicate(req, batch, queued)
        batch.emit(EventKind.FINISHED, req, outcome=outcome)
        return outcome

    async def _run_tool(
        self, call: ValidCall, batch: Batch, scope: CancelScope, marks: tuple[Mark, ...]
    ) -> tuple[Outcome, str]:
        decided_on = self._active[_key(call)].policy_input
        assert decided_on is not None  # set by _authorize before anything runs
        set_by = self.policy.limits_for(decided_on)
        limits, timeout = call_limits(self.limits, set_by, call, batch.deadline)
        return await run_tool(
            call,
            workspace=self.workspace,
            sandboxes=self.sandboxes,
            limits=limits,
            allowed_s=timeout,
            scope=scope,
            decided_on=decided_on,
            readable=self.authorizer.readable(call, batch.agent, self._active[_key(call)]),
            hard_links=self.authorizer.hard_links(),
            marks=marks,
        )


def _key(call: ValidCall) -> tuple[str, str]:
    return (call.request.run_id, call.request.call_id)


def _owner(req: CallRequest) -> str:
    """How a call is named in the lock table and in WAITING events."""
    return f"{req.run_id}/{req.call_id}"
