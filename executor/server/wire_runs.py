"""Protobuf at the edge, for the Runs service: `runs.proto` messages to and from the
daemon's run records (the Executor and Approvals messages are in `wire`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence

from execgate.executor.core import clock
from execgate.executor.core.errors import MalformedRequest
from execgate.executor.core.requests import MAX_JSON_DEPTH, nested_deeper
from execgate.executor.core.run import CancelAsk, Run
from execgate.executor.core.runstate import LIMIT_KEYS, State, Transition
from execgate.executor.journal.store import CallRecord
from execgate.executor.pipeline.events import Event
from execgate.executor.runs.registry import Refusal, RunRefused, Update
from execgate.v1 import runs_pb2 as rpb

from . import wirecheck
from .wire import (
    MAX_REASON_CHARS,
    BatchRequest,
    batch_request,
    batch_response,
    event,
    record,
    timestamp,
)


def run_request(request: rpb.StartRunRequest, *, owner: str) -> Run:
    """The run a StartRun asks for, owned by `owner`."""
    limits = {
        k: wirecheck.non_negative(getattr(request.limits, k), f"limits.{k}")
        for k in LIMIT_KEYS
        if getattr(request.limits, k)
    }
    return Run(
        run_id=request.run_id,
        goal=request.goal,
        owner=owner,
        limits=limits,
        model=request.model,
        config_version=request.config_version,
        labels=dict(request.labels),
        workspace=request.workspace,
    )


def transitions(request: rpb.AppendEventsRequest) -> list[Transition]:
    return [transition(request.run_id, i, e) for i, e in enumerate(request.events)]


def transition(run_id: str, i: int, e: rpb.RunEvent) -> Transition:
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


def step_request(
    request: rpb.StepRequest, new_id: Callable[[str], str]
) -> tuple[list[Transition], BatchRequest]:
    """A Step's opening transitions and its batch. A step names its run and each call's
    id and idempotency key: a retried step must find its calls again."""
    if not request.run_id:
        raise MalformedRequest("missing", "run_id", "run_id: a step belongs to a started run")
    if not request.events:
        raise MalformedRequest("missing", "events", "events: a step opens with its transitions")
    if not request.calls:
        raise MalformedRequest("missing", "calls", "calls: a step runs at least one call")
    for i, c in enumerate(request.calls):
        for name in ("call_id", "idempotency_key"):
            if not getattr(c, name):
                field_name = f"calls[{i}].{name}"
                raise MalformedRequest("missing", field_name, f"{field_name}: required in a step")
    events = [transition(request.run_id, i, e) for i, e in enumerate(request.events)]
    return events, batch_request(request, default_run=request.run_id, new_id=new_id)


def step_update(
    *, call: Event | None = None, moved: Transition | None = None, run: Run | None = None
) -> rpb.StepUpdate:
    """One message of a Step stream: a batch event, a recorded transition, or the run."""
    if call is not None:
        return rpb.StepUpdate(call=event(call))
    if moved is not None:
        return rpb.StepUpdate(event=event_msg(moved))
    assert run is not None
    return rpb.StepUpdate(run=run_msg(run))


def step_response(
    batch_id: str, finished: Sequence[Event | None], moves: Iterable[Transition], run: Run
) -> rpb.StepResponse:
    """StepBatch's answer: each call's FINISHED event in proposal order, the moves the
    daemon recorded for the step, and the run after it."""
    return rpb.StepResponse(
        batch_id=batch_id,
        outcomes=batch_response(batch_id, finished).outcomes,
        events=[event_msg(m) for m in moves],
        run=run_msg(run),
    )


def cancel_reason(request: rpb.CancelRunRequest) -> str:
    """Why a CancelRun stops the run; a reason over MAX_REASON_CHARS is malformed."""
    if len(request.reason) > MAX_REASON_CHARS:
        raise MalformedRequest(
            "too_large", "reason", f"reason: longer than {MAX_REASON_CHARS} characters"
        )
    return request.reason or "cancelled"


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
        created_at=timestamp(r.created_at),
        updated_at=timestamp(r.updated_at),
        workspace=r.workspace,
    )
    if r.cancel is not None:
        msg.cancel.CopyFrom(_cancel_msg(r.cancel))
    return msg


def run_detail(
    run: Run, events: Iterable[Transition], calls: Iterable[CallRecord]
) -> rpb.RunDetail:
    return rpb.RunDetail(
        run=run_msg(run), events=[event_msg(e) for e in events], calls=[record(c) for c in calls]
    )


def runs(found: Iterable[Run]) -> rpb.ListRunsResponse:
    return rpb.ListRunsResponse(runs=[run_msg(r) for r in found])


def event_msg(e: Transition) -> rpb.RunEvent:
    return rpb.RunEvent(
        seq=e.seq,
        at=timestamp(e.at),
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
    return rpb.CancelRequestRecord(requester=c.requester, reason=c.reason, at=timestamp(c.at))
