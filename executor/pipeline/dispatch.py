"""The call pipeline: the orchestration of its stages, one module each.

    validate -> ValidCall -> authorize -> Authorized -> approve -> Approved
      -> admit (its turn in the batch, its idempotency key) -> schedule (locks, intent)
      -> run (the tool) -> the outcome journaled, then reported

Each stage takes the record the one before returned (calls.py); a call that ends on
the way ends in `endings` (refused, replayed, a duplicate, a crash), with the
furthest record it reached.

One `Dispatcher` serves every Execute stream. Each call of a batch runs as its
own task owned by the dispatcher (not by the RPC), so a client that disconnects
does not interrupt a call that already started: it finishes and is recorded.
Calls of that batch still queued are REJECTED (cancelled) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import Mark, Outcome, Phase, mark
from execgate.executor.core.paths import Workspace
from execgate.executor.journal.base import JournalStore
from execgate.executor.journal.records import KeyTaken, Notice, NoticeKind
from execgate.executor.locks import LockBackend
from execgate.executor.policy import Policy
from execgate.executor.sandbox.registry import Sandboxes
from execgate.executor.tools import CancelScope, Limits, Tool
from execgate.executor.tools.toolset import ToolSet

from . import admit, resend, results
from .approve import Approval, Approvals, Detached, verdict
from .authorize import Authorizer
from .calls import Approved, Authorized, CallRequest, Reached
from .endings import Endings, decided
from .events import ENDS, Batch, Event, EventKind, PlanRow
from .explain import plan
from .idempotency import Idempotency
from .inflight import Active, CancelOrder, InFlight
from .run import Runner
from .schedule import Scheduler
from .telemetry import CallTelemetry
from .validate import Validator
from .workspaces import Workspaces

if TYPE_CHECKING:
    from execgate.executor.telemetry.tracing import BatchSpan

log = logging.getLogger("execgate.dispatch")


class Dispatcher:
    def __init__(
        self,
        *,
        tools: dict[str, Tool] | ToolSet,
        journal: JournalStore,
        policy: Policy,
        workspace: Workspace,
        limits: Limits,
        locks: LockBackend,
        sandboxes: Sandboxes,
    ) -> None:
        self.journal = journal
        # Decides each call under the policy in force (reloads swap `policy`).
        self.authorizer = Authorizer(policy)
        self.workspace = workspace
        self.limits = limits
        self._validator = Validator(tools, workspace, limits)
        # Which workspace each call works in (the policy's `workspaces:`, a run's).
        self.workspaces = Workspaces(workspace, self.authorizer)
        self._idempotency = Idempotency(journal)
        self._endings = Endings(journal)
        self._locks = locks
        self._runner = runner = Runner(self.authorizer, sandboxes, limits)
        self._scheduler = Scheduler(journal, locks, self._endings, runner, self.authorizer.quota)
        self.sandboxes = sandboxes
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
        self.telemetry = CallTelemetry()
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
        return await plan(
            calls, agent, self._validator, self.authorizer, self._runner.confines, self.workspaces
        )

    async def cancel(self, order: CancelOrder) -> list[str]:
        """Record the request, then ask the targeted calls to stop; returns the ids reached."""
        return await self._inflight.cancel(order)

    async def heard(self, notice: Notice) -> None:
        """What another daemon sharing the journal recorded, for the calls here: a cancel
        reaches the targeted calls running here, a decision the call parked here, a
        keyed call's end the calls waiting for it; approvals a dead daemon had parked
        are parked here (its reaper adopted them)."""
        match notice.kind:
            case NoticeKind.CANCEL if notice.cancel is not None:
                reached = self._inflight.heard(notice.cancel)
                if reached:
                    log.info("cancel from another daemon reached %s", ", ".join(reached))
            case NoticeKind.APPROVAL:
                await self.approvals.heard(notice.key)
            case NoticeKind.CALL:
                agent, _, key = notice.key.partition("\0")
                self._idempotency.heard(agent, key)
            case NoticeKind.RESYNC:
                self._idempotency.reread()
                await self.approvals.reread()
                # Whole-run cancels recorded meanwhile: bar the runs, stop their calls here.
                barred = await asyncio.to_thread(self.journal.cancels.barred_runs)
                for run_id, rec in barred.items():
                    if run_id not in self._inflight.barred:
                        self._inflight.heard(rec)
            case NoticeKind.ADOPTED:
                self.resume_parked(list(notice.approvals))
            case _:  # runs and the lease are the server's
                return

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

    async def _resumed(
        self, req: CallRequest, batch: Batch, parked: Approval, span: BatchSpan
    ) -> None:
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
        self.workspaces.close()

    def force(self) -> None:
        """End every grace period now: in-flight calls are killed, and still recorded."""
        self._inflight.force_all("daemon shutting down (forced)")

    def queue_depth(self) -> int:
        """Calls in the daemon that have not started (queued, parked, waiting for locks)."""
        return sum(1 for active in list(self._active.values()) if not active.started)

    def new_id(self, kind: str) -> str:
        """A daemon-assigned call or batch id: unique across restarts, cheap to make."""
        return f"{kind}_{self._id_prefix}{next(self._ids):x}"

    @property
    def toolset(self) -> ToolSet:
        """The tools served now (built-ins, the tools file's, the providers')."""
        return self._validator.toolset

    @toolset.setter
    def toolset(self, toolset: ToolSet) -> None:
        self._validator.toolset = toolset  # one assignment: a call sees the old or the new

    @property
    def tools(self) -> Mapping[str, Tool]:
        return self._validator.toolset.tools

    @property
    def policy(self) -> Policy:
        return self.authorizer.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.authorizer.policy = policy  # one assignment: a call sees the old or the new

    # -- one call: validate -> authorize -> approve -> admit -> schedule -> run -----------

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
            await self._endings.crashed(req, batch, queued, exc)
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
        active = Active(CancelScope(), batch)
        self._active[key] = active
        try:
            approved = await self._decided(req, batch, active, queued, parked)
            if approved is not None:
                await self._admitted(approved, batch, active, queued)
        finally:
            self._active.pop(key).ended.set()

    async def _decided(
        self, req: CallRequest, batch: Batch, active: Active, queued: Mark, parked: Approval | None
    ) -> Approved | None:
        """Validate, authorize, approve: the call as it may join the lock queue, or None
        once it has ended (refused, answered or crashed; journaled before reported)."""
        reached: Reached = None  # the furthest stage record: what its ending reports
        try:
            try:
                workspace, req = self.workspaces.choose(req, batch.agent)
                valid = await self._validator.validate(req, workspace)
                async with self._redecided(parked):
                    reached = self.authorizer.authorize(valid, batch.agent)
                    self.authorizer.enforce(reached)
                self._may_start(req, batch)
                # A call parked before a restart waits for the approval it has.
                ask = parked or reached.decision.ask
                if ask is None:
                    return Approved(authorized=reached)
                # A re-sent call that already finished is answered, not asked again.
                if parked is None and await self._answered(reached, batch):
                    return None
                # Parked before the lock queue: it holds no locks while it waits.
                on_park = functools.partial(setattr, active, "parked")
                reached = await self.approvals.gate(reached, batch, active.scope, ask, on_park)
                verdict(reached, active.scope)
                self._may_start(req, batch)
                return reached
            except ToolError as err:
                outcome = results.from_error(err, (queued,))
                await self._endings.reject(req, batch, outcome, decided(reached), reached)
        except Detached:
            raise
        except Exception as exc:
            # A bug or a journal failure: the call still ends with the outcome that
            # can be vouched for (REJECTED: it never started), journaled first.
            await self._endings.crashed(req, batch, queued, exc, reached)
        return None

    @contextlib.asynccontextmanager
    async def _redecided(self, parked: Approval | None) -> AsyncIterator[None]:
        """A call parked before a restart is decided again: its approval is abandoned
        when the policy now in force refuses it."""
        try:
            yield
        except ToolError as err:
            if parked is not None:
                await self.approvals.abandon(parked, f"the policy now in force denies it: {err}")
            raise

    def _may_start(self, req: CallRequest, batch: Batch) -> None:
        """Raise the REJECTED ToolError of a call that must not start now."""
        refusal = admit.refusal(
            req.run_id,
            batch,
            closing=self._closing,
            barred=self._inflight.barred,
            owners=self.run_owners,
            ended=self.ended_runs,
        )
        if refusal is not None:
            raise refusal

    async def _answered(self, authorized: Authorized, batch: Batch) -> bool:
        return await resend.answered(authorized, batch, self.journal, self._endings)

    async def _in_flight_duplicate(self, req: CallRequest, batch: Batch, queued: Mark) -> None:
        """A client resending a call that still runs joins it if its idempotency key says
        so (one parked for an approval, or approved since, is followed to its end)."""
        owner = self._active[(req.run_id, req.call_id)]
        if await resend.join_parked(req, batch, owner, self.journal):
            return
        if req.idempotency_key:
            try:
                workspace, pinned = self.workspaces.choose(req, batch.agent)
                call = await self._validator.validate(pinned, workspace)
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

    async def _taken_elsewhere(self, approved: Approved, batch: Batch) -> Outcome:
        """The call's idempotency key was taken, as it was about to start, by a call of
        another daemon sharing the journal: answered with that call's outcome."""
        req, valid = approved.request, approved.valid
        replay = await self._idempotency.elsewhere(
            batch.agent, req.idempotency_key, valid.request_hash
        )
        await self._endings.replay(valid, batch, replay, approved)
        return replay.outcome

    async def _admitted(
        self, approved: Approved, batch: Batch, active: Active, queued: Mark
    ) -> None:
        """Admit the call to the lock queue in its batch's order, claiming its idempotency
        key (a call whose key already has an outcome is answered with it), then schedule."""
        req = approved.request
        try:
            # Calls of a batch reach the lock queue in proposal order (Batch.turns).
            await batch.my_turn(req.index)
            if req.idempotency_key and not await admit.claim(
                approved, batch, queued, self._idempotency, self._endings
            ):
                return
            outcome: Outcome | BaseException = RuntimeError("call did not finish")
            try:
                outcome = await self._scheduler.schedule(approved, batch, active, queued)
            except KeyTaken:  # another daemon's call holds the key: never run twice
                outcome = await self._taken_elsewhere(approved, batch)
            finally:
                if req.idempotency_key:
                    self._idempotency.release(batch.agent, req.idempotency_key, outcome)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug or a journal failure: the call still ends with the outcome that
            # can be vouched for (REJECTED if it never started), journaled first.
            await self._endings.crashed(req, batch, queued, exc, approved, started=active.started)
