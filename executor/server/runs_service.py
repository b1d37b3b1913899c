"""The Runs servicer: run records in and out (proto/execgate/v1/runs.proto).

A run belongs to the identity that started it: only it appends events; it or an
operator/admin may cancel it. Every refusal is a gRPC status naming the field:
NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, INVALID_ARGUMENT (malformed) or
FAILED_PRECONDITION (the events do not continue the run's history).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc

from execgate.executor.core import clock
from execgate.executor.core.errors import MalformedRequest
from execgate.executor.core.fanout import Lagging
from execgate.executor.core.requests import MAX_JSON_DEPTH, nested_deeper
from execgate.executor.core.run import CancelAsk, Run
from execgate.executor.core.runstate import LIMIT_KEYS, State, Transition
from execgate.executor.journal.store import CallFilter
from execgate.executor.pipeline.dispatch import Dispatcher
from execgate.executor.pipeline.inflight import CancelOrder, NotYours
from execgate.executor.policy.scope import scope_of
from execgate.executor.runs.registry import Closing, Refusal, RunRefused, RunStore, Update
from execgate.v1 import runs_pb2 as rpb
from execgate.v1 import runs_pb2_grpc as rpb_grpc

from . import wire, wirecheck
from .auth import caller
from .services import CANCELS_ANY, MAX_REASON_CHARS
from .status import abort_for

MAX_CALLS_SHOWN = 1000
# What ListRuns `states` may hold: the loop's states, and "active" (every non-terminal one).
RUN_STATES = frozenset({"active", *(s.value for s in State)})

Context = grpc.aio.ServicerContext[Any, Any]


class RunsService(rpb_grpc.RunsServicer):
    def __init__(self, store: RunStore, dispatcher: Dispatcher) -> None:
        self.store = store
        self.dispatcher = dispatcher

    async def StartRun(self, request: rpb.StartRunRequest, context: Context) -> rpb.Run:
        limits = {
            k: wirecheck.non_negative(getattr(request.limits, k), f"limits.{k}")
            for k in LIMIT_KEYS
            if getattr(request.limits, k)
        }
        asked = Run(
            run_id=request.run_id,
            goal=request.goal,
            owner=caller().name,
            limits=limits,
            model=request.model,
            config_version=request.config_version,
            labels=dict(request.labels),
        )
        try:
            return run_msg(await self.store.start(asked))
        except RunRefused as exc:
            await abort_for(context, exc)

    async def AppendEvents(self, request: rpb.AppendEventsRequest, context: Context) -> rpb.Run:
        try:
            events = [_transition(request.run_id, i, e) for i, e in enumerate(request.events)]
            return run_msg(await self.store.append(request.run_id, events, caller().name))
        except RunRefused as exc:
            await abort_for(context, exc)

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
        return rpb.RunDetail(
            run=run_msg(run),
            events=[event_msg(e) for e in events],
            calls=[wire.record(c) for c in reversed(calls)],
        )

    async def ListRuns(
        self, request: rpb.ListRunsRequest, context: Context
    ) -> rpb.ListRunsResponse:
        states = wirecheck.known_strings(request.states, RUN_STATES, "states")
        if request.limit < 0:
            raise MalformedRequest("out_of_range", "limit", "limit: must not be negative")
        scope = scope_of(caller(), self.dispatcher.policy)
        runs = await self.store.find(states, request.owner, request.limit, scope.agents)
        return rpb.ListRunsResponse(runs=[run_msg(r) for r in runs])

    async def _visible(self, run_id: str) -> Run:
        """The run, if the caller's scope holds its owner; else NOT_FOUND, as for a run
        that does not exist (scope.py)."""
        run = await self.store.get(run_id)
        if not scope_of(caller(), self.dispatcher.policy).allows(run.owner):
            raise RunRefused(Refusal.NOT_FOUND, f"no run {run_id!r}", "run_id")
        return run

    async def CancelRun(self, request: rpb.CancelRunRequest, context: Context) -> rpb.Run:
        if len(request.reason) > MAX_REASON_CHARS:
            raise MalformedRequest(
                "too_large", "reason", f"reason: longer than {MAX_REASON_CHARS} characters"
            )
        who = caller()
        ask = CancelAsk(who.name, request.reason or "cancelled", clock.now())
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
        return run_msg(run)

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
                    yield update_msg(update)
        except (Closing, Lagging) as exc:
            await abort_for(context, exc)


def _transition(run_id: str, i: int, e: rpb.RunEvent) -> Transition:
    at = wirecheck.timestamp(e.at, f"events[{i}].at") if e.HasField("at") else clock.now()
    too_deep = MalformedRequest(
        "too_deep",
        f"events[{i}].data_json",
        f"events[{i}].data_json: nested deeper than {MAX_JSON_DEPTH} levels",
    )
    try:
        data = json.loads(e.data_json or "{}")
        from_state, to_state = State(e.from_state), State(e.to_state)
    except RecursionError:
        raise too_deep from None
    except ValueError as exc:
        raise RunRefused(Refusal.MALFORMED, f"event seq {e.seq}: {exc}", "events") from None
    if nested_deeper(data):
        raise too_deep
    if not isinstance(data, dict):
        raise RunRefused(Refusal.MALFORMED, f"event seq {e.seq}: data_json not an object", "events")
    return Transition(run_id, e.seq, at, from_state, to_state, e.reason, data)


def run_msg(r: Run) -> rpb.Run:
    msg = rpb.Run(
        run_id=r.run_id,
        goal=r.goal,
        owner=r.owner,
        limits=rpb.RunLimits(**{k: v for k, v in r.limits.items() if k in LIMIT_KEYS}),
        model=r.model,
        config_version=r.config_version,
        labels=r.labels,
        state=r.state,
        terminal=r.terminal,
        reason=r.reason,
        last_seq=r.last_seq,
        created_at=wire.timestamp(r.created_at),
        updated_at=wire.timestamp(r.updated_at),
    )
    if r.cancel is not None:
        msg.cancel.CopyFrom(_cancel_msg(r.cancel))
    return msg


def event_msg(e: Transition) -> rpb.RunEvent:
    return rpb.RunEvent(
        seq=e.seq,
        at=wire.timestamp(e.at),
        from_state=e.from_state.value,
        to_state=e.to_state.value,
        reason=e.reason,
        data_json=json.dumps(e.data),
    )


def update_msg(u: Update) -> rpb.RunUpdate:
    if u.event is not None:
        return rpb.RunUpdate(event=event_msg(u.event))
    assert u.cancel is not None
    return rpb.RunUpdate(cancel=_cancel_msg(u.cancel))


def _cancel_msg(c: CancelAsk) -> rpb.CancelRequestRecord:
    return rpb.CancelRequestRecord(requester=c.requester, reason=c.reason, at=wire.timestamp(c.at))
