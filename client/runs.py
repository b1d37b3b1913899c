"""The daemon's run records, from the client: `Client.runs` (see proto runs.proto).

A run's events are the loop's `Transition`s (execgate.client.loop.states), the same
record whichever language wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from execgate.v1 import runs_pb2 as rpb
from execgate.v1 import runs_pb2_grpc as rpb_grpc
from execgate.v1.runstates import LIMIT_KEYS

from . import wire
from .errors import RequestError
from .loop.states import State, Transition
from .types import Call, CallRecord, Event, Outcome


@dataclass(frozen=True, slots=True)
class CancelNotice:
    """Someone asked the run to stop (CancelRun): who, why, when (epoch seconds)."""

    requester: str
    reason: str
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    run_id: str
    goal: str
    owner: str
    limits: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    config_version: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    state: State = State.CREATED
    terminal: bool = False
    reason: str = ""
    last_seq: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    cancel: CancelNotice | None = None
    # The workspace every call of the run works in.
    workspace: str = ""


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a loop step (`Runs.step`) ended with."""

    batch_id: str
    # The calls' outcomes, in the order they were given.
    outcomes: tuple[Outcome, ...]
    # The transitions the daemon recorded for the step after the ones sent, in order:
    # awaiting_approval and back while calls waited for an approval, then the batch's end.
    events: tuple[Transition, ...]
    # The run after the step (with any cancel request).
    run: RunInfo


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: RunInfo
    events: tuple[Transition, ...]
    # The run's tool calls as the daemon's journal has them, oldest first.
    calls: tuple[CallRecord, ...]


class Runs:
    """StartRun, AppendEvents, Step, GetRun, ListRuns, CancelRun, WatchRun."""

    def __init__(self, channel: grpc.Channel, metadata: Sequence[tuple[str, str]], address: str):
        self._stub = rpb_grpc.RunsStub(channel)
        self._metadata = tuple(metadata)
        self._address = address

    def start(
        self,
        goal: str,
        *,
        run_id: str = "",
        limits: Mapping[str, Any] | None = None,
        model: str = "",
        config_version: str = "",
        labels: Mapping[str, str] | None = None,
        workspace: str = "",
    ) -> RunInfo:
        """Open a run owned by this client's identity; `run_id` "" lets the daemon pick.
        `workspace`: where every call of the run works (one the policy gives this
        identity; "": its first); PermissionDenied for one it was not given."""
        request = rpb.StartRunRequest(
            run_id=run_id,
            goal=goal,
            limits=rpb.RunLimits(**{k: v for k, v in (limits or {}).items() if v}),
            model=model,
            config_version=config_version,
            labels=dict(labels or {}),
            workspace=workspace,
        )
        return run_info(self._call("StartRun", request, run_id))

    def append(self, run_id: str, events: Iterable[Transition]) -> RunInfo:
        """Persist transitions (all or none); RunRefused if they do not continue the run."""
        request = rpb.AppendEventsRequest(run_id=run_id, events=[event_msg(e) for e in events])
        return run_info(self._call("AppendEvents", request, run_id))

    def step(
        self,
        run_id: str,
        events: Sequence[Transition],
        calls: Sequence[Call],
        *,
        deadline: float | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> StepResult:
        """One loop step in one round trip (Runs.Step): persist `events` (the last one
        enters running_tools), run `calls` (each with its call id and idempotency key),
        and get the batch's end the daemon recorded. Sent again after a lost answer,
        it is recognised: nothing is appended or run twice, the answer is the same.

        `on_event`: each event of the batch as it happens (the streaming Step); without
        it, one answer at the end (StepBatch, cheaper). RunRefused if `events` do not
        continue the run."""
        request = rpb.StepRequest(
            run_id=run_id,
            events=[event_msg(e) for e in events],
            calls=[wire.tool_call(c) for c in calls],
            outcomes_only=on_event is None,
        )
        if deadline is not None:
            request.deadline.FromNanoseconds(int(deadline * 1e9))
        if on_event is None:
            return step_result(run_id, self._call("StepBatch", request, run_id))
        return self._streamed(request, on_event)

    def _streamed(self, request: rpb.StepRequest, on_event: Callable[[Event], None]) -> StepResult:
        run_id = request.run_id
        finished: dict[int, Outcome] = {}
        moved: list[Transition] = []
        run: RunInfo | None = None
        batch_id = ""
        try:
            for update in self._stub.Step(request, metadata=self._metadata):
                match update.WhichOneof("update"):
                    case "call":
                        event = wire.event(update.call)
                        batch_id = event.batch_id
                        on_event(event)
                        if event.outcome is not None:
                            finished[event.index] = event.outcome
                    case "event":
                        moved.append(transition(run_id, update.event))
                    case "run":
                        run = run_info(update.run)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self._address, run_id=run_id, run_op=True) from exc
        if run is None or len(finished) != len(request.calls):
            raise RequestError("UNKNOWN", f"Step {run_id}: the stream ended before the step")
        outcomes = tuple(finished[i] for i in range(len(request.calls)))
        return StepResult(batch_id, outcomes, tuple(moved), run)

    def get(self, run_id: str) -> RunDetail:
        msg = self._call("GetRun", rpb.GetRunRequest(run_id=run_id), run_id)
        return RunDetail(
            run_info(msg.run),
            tuple(transition(run_id, e) for e in msg.events),
            tuple(wire.record(c) for c in msg.calls),
        )

    def find(
        self, *, states: Iterable[str] = (), owner: str = "", limit: int = 100
    ) -> list[RunInfo]:
        """Runs, newest first; `states` may include "active" (every non-terminal state)."""
        request = rpb.ListRunsRequest(states=list(states), owner=owner, limit=limit)
        return [run_info(r) for r in self._call("ListRuns", request, "").runs]

    def cancel(self, run_id: str, reason: str = "") -> RunInfo:
        """Ask the run to stop: its tool calls are cancelled now; its loop ends it."""
        request = rpb.CancelRunRequest(run_id=run_id, reason=reason)
        return run_info(self._call("CancelRun", request, run_id))

    def watch(self, run_id: str, after_seq: int = 0) -> Iterator[Transition | CancelNotice]:
        """The run's events after `after_seq`, then new ones and cancel requests, until
        it ends."""
        request = rpb.WatchRunRequest(run_id=run_id, after_seq=after_seq)
        try:
            for update in self._stub.WatchRun(request, metadata=self._metadata):
                if update.HasField("event"):
                    yield transition(run_id, update.event)
                else:
                    yield _cancel(update.cancel)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self._address, run_id=run_id, run_op=True) from exc

    def _call(self, method: str, request: Any, run_id: str) -> Any:
        try:
            return getattr(self._stub, method)(request, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self._address, run_id=run_id, run_op=True) from exc


def step_result(run_id: str, msg: rpb.StepResponse) -> StepResult:
    return StepResult(
        batch_id=msg.batch_id,
        outcomes=tuple(wire.outcomes(msg)),
        events=tuple(transition(run_id, e) for e in msg.events),
        run=run_info(msg.run),
    )


def run_info(msg: rpb.Run) -> RunInfo:
    return RunInfo(
        run_id=msg.run_id,
        goal=msg.goal,
        owner=msg.owner,
        limits={k: getattr(msg.limits, k) for k in LIMIT_KEYS if getattr(msg.limits, k)},
        model=msg.model,
        config_version=msg.config_version,
        labels=dict(msg.labels),
        state=State(msg.state),
        terminal=msg.terminal,
        reason=msg.reason,
        last_seq=msg.last_seq,
        created_at=_seconds(msg.created_at),
        updated_at=_seconds(msg.updated_at),
        cancel=_cancel(msg.cancel) if msg.HasField("cancel") else None,
        workspace=msg.workspace,
    )


def event_msg(e: Transition) -> rpb.RunEvent:
    at = Timestamp()
    at.FromNanoseconds(round(e.at * 1e9))
    return rpb.RunEvent(
        seq=e.seq,
        at=at,
        from_state=e.from_state.value,
        to_state=e.to_state.value,
        reason=e.reason,
        data_json=json.dumps(e.data),
    )


def transition(run_id: str, msg: rpb.RunEvent) -> Transition:
    return Transition(
        run_id=run_id,
        seq=msg.seq,
        at=_seconds(msg.at),
        from_state=State(msg.from_state),
        to_state=State(msg.to_state),
        reason=msg.reason,
        data=json.loads(msg.data_json or "{}"),
    )


def _cancel(msg: rpb.CancelRequestRecord) -> CancelNotice:
    return CancelNotice(msg.requester, msg.reason, _seconds(msg.at))


def _seconds(ts: Timestamp) -> float:
    return ts.ToNanoseconds() / 1e9
