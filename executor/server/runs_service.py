"""The Runs servicer: run records in and out (proto/execgate/v1/runs.proto).

A run belongs to the identity that started it: only it appends events; it or an
operator/admin may cancel it. Every refusal is a gRPC status naming the field:
NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, INVALID_ARGUMENT (malformed) or
FAILED_PRECONDITION (the events do not continue the run's history).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc

from execgate.executor.core import clock
from execgate.executor.core.errors import MalformedRequest, ToolError
from execgate.executor.core.fanout import Lagging
from execgate.executor.core.run import CancelAsk, Run
from execgate.executor.core.runstate import State
from execgate.executor.journal.store import CallFilter
from execgate.executor.pipeline.dispatch import Dispatcher
from execgate.executor.pipeline.events import Event, EventKind
from execgate.executor.pipeline.inflight import CancelOrder, NotYours
from execgate.executor.pipeline.runstep import StepMoves
from execgate.executor.policy.scope import scope_of
from execgate.executor.runs.registry import Closing, Refusal, RunRefused, RunStore
from execgate.v1 import runs_pb2 as rpb
from execgate.v1 import runs_pb2_grpc as rpb_grpc

from . import wire_runs, wirecheck
from .auth import caller
from .services import CANCELS_ANY, batch_events
from .status import abort_for
from .wire import BatchRequest

MAX_CALLS_SHOWN = 1000
# What ListRuns `states` may hold: the loop's states, and "active" (every non-terminal one).
RUN_STATES = frozenset({"active", *(s.value for s in State)})

Context = grpc.aio.ServicerContext[Any, Any]


class RunsService(rpb_grpc.RunsServicer):
    def __init__(self, store: RunStore, dispatcher: Dispatcher) -> None:
        self.store = store
        self.dispatcher = dispatcher

    async def StartRun(self, request: rpb.StartRunRequest, context: Context) -> rpb.Run:
        asked = wire_runs.run_request(request, owner=caller().name)
        try:
            # Bound to a workspace the policy gives its owner (its first if it names none).
            bound = self._workspace(asked.owner, asked.workspace)
            return wire_runs.run_msg(await self.store.start(replace(asked, workspace=bound)))
        except RunRefused as exc:
            await abort_for(context, exc)

    def _workspace(self, owner: str, asked: str) -> str:
        try:
            return self.dispatcher.workspaces.grant(owner, asked).name
        except ToolError as exc:
            raise RunRefused(Refusal.FORBIDDEN, exc.message, exc.field) from None

    async def AppendEvents(self, request: rpb.AppendEventsRequest, context: Context) -> rpb.Run:
        try:
            events = wire_runs.transitions(request)
            return wire_runs.run_msg(await self.store.append(request.run_id, events, caller().name))
        except RunRefused as exc:
            await abort_for(context, exc)

    async def Step(
        self, request: rpb.StepRequest, context: Context
    ) -> AsyncIterator[rpb.StepUpdate]:
        step, batch = await self._open_step(request, context)
        # The daemon's moves need the approval events, whatever the client asked to see.
        events = batch_events(self.dispatcher, batch, context, True)
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    moves = await step.on_event(event)
                    if not batch.outcomes_only or event.kind is EventKind.FINISHED:
                        yield wire_runs.step_update(call=event)
                    for moved in moves:
                        yield wire_runs.step_update(moved=moved)
            for moved in await step.end():
                yield wire_runs.step_update(moved=moved)
        except RunRefused as exc:
            await abort_for(context, exc)
        yield wire_runs.step_update(run=await self._after(step))

    async def StepBatch(self, request: rpb.StepRequest, context: Context) -> rpb.StepResponse:
        step, batch = await self._open_step(request, context)
        finished: list[Event | None] = [None] * len(batch.calls)
        events = batch_events(self.dispatcher, batch, context, True)
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    await step.on_event(event)
                    if event.kind is EventKind.FINISHED:
                        finished[event.index] = event
            await step.end()
        except RunRefused as exc:
            await abort_for(context, exc)
        run = await self._after(step)
        return wire_runs.step_response(batch.batch_id, finished, step.recorded, run)

    async def _open_step(
        self, request: rpb.StepRequest, context: Context
    ) -> tuple[StepMoves, BatchRequest]:
        """The step's transitions recorded (or found: a retry), its batch to send."""
        try:
            opening, batch = wire_runs.step_request(request, self.dispatcher.new_id)
            run = await self.store.open_step(request.run_id, opening, caller().name)
        except RunRefused as exc:
            await abort_for(context, exc)
        step = StepMoves(self.store, run.run_id, batch.calls, seen=opening[-1].seq, run=run)
        return step, batch

    async def _after(self, step: StepMoves) -> Run:
        return step.run if step.run is not None else await self.store.get(step.run_id)

    async def GetRun(self, request: rpb.GetRunRequest, context: Context) -> rpb.RunDetail:
        try:
            run = await self._visible(request.run_id)
        except RunRefused as exc:
            await abort_for(context, exc)
        events = await self.store.events(run.run_id)
        # Every call of a run the caller may see (its owner's, and refusals of others').
        calls, _ = await self.dispatcher.journal.list(
            CallFilter(run_id=run.run_id, limit=MAX_CALLS_SHOWN)
        )
        return wire_runs.run_detail(run, events, reversed(calls))

    async def ListRuns(
        self, request: rpb.ListRunsRequest, context: Context
    ) -> rpb.ListRunsResponse:
        states = wirecheck.known_strings(request.states, RUN_STATES, "states")
        if request.limit < 0:
            raise MalformedRequest("out_of_range", "limit", "limit: must not be negative")
        scope = scope_of(caller(), self.dispatcher.policy)
        runs = await self.store.find(states, request.owner, request.limit, scope.agents)
        return wire_runs.runs(runs)

    async def _visible(self, run_id: str) -> Run:
        """The run, if the caller's scope holds its owner; else NOT_FOUND, as for a run
        that does not exist (scope.py)."""
        run = await self.store.get(run_id)
        if not scope_of(caller(), self.dispatcher.policy).allows(run.owner):
            raise RunRefused(Refusal.NOT_FOUND, f"no run {run_id!r}", "run_id")
        return run

    async def CancelRun(self, request: rpb.CancelRunRequest, context: Context) -> rpb.Run:
        reason = wire_runs.cancel_reason(request)
        who = caller()
        ask = CancelAsk(who.name, reason, clock.now())
        try:
            run = await self.store.get(request.run_id)
            if who.name != run.owner and not who.holds_any(CANCELS_ANY):
                raise RunRefused(
                    Refusal.FORBIDDEN,
                    f"run {run.run_id!r} belongs to {run.owner}; only it, an operator or an "
                    "admin may cancel it",
                    "run_id",
                )
            run = await self.store.request_cancel(run.run_id, ask)
        except RunRefused as exc:
            await abort_for(context, exc)
        order = CancelOrder(
            run_id=run.run_id,
            reason=ask.reason,
            requester=ask.requester,
            at=ask.at,
            # The owner reaches only its own calls (none of anyone else's join its run).
            only_agent="" if who.holds_any(CANCELS_ANY) else who.name,
        )
        try:
            await self.dispatcher.cancel(order)  # journaled first, then signalled
        except NotYours as exc:
            await abort_for(context, exc)
        return wire_runs.run_msg(run)

    async def WatchRun(
        self, request: rpb.WatchRunRequest, context: Context
    ) -> AsyncIterator[rpb.RunUpdate]:
        try:
            await self._visible(request.run_id)
        except RunRefused as exc:
            await abort_for(context, exc)
        updates = self.store.watch(request.run_id, request.after_seq)
        try:
            async with contextlib.aclosing(updates):
                async for update in updates:
                    yield wire_runs.update_msg(update)
        except (Closing, Lagging) as exc:
            await abort_for(context, exc)
