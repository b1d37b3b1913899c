"""`Loop`: the agent loop, run against the daemon as an explicit state machine.

Each step is a transition persisted to the daemon (Runs.AppendEvents; a tool batch
and the transitions around it in one round trip, Runs.Step) before the next one begins;
the stop rules are checked before every model request and
before and after every tool batch; the first rule to fire ends the run, exactly
once, with its figures. The model's final answer is a proposal: it completes the
run only if the verifier (if any) accepts it and no call of the run is pending.

    created -> requesting_model -> validating -> running_tools -> requesting_model ...
                                             \\-> completed (verified answer)
    any non-terminal -> failed | cancelled | budget_exhausted | expired | escalated
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..models.base import Message, Model, ModelTool
from ..types import Event
from .record import (
    Conversation,
    rebuild,
)
from .results import (
    DEFAULT_LIMITS,
    TRACER,
    LoopResult,
    Verifier,
    close_span,
    monotonic_start,
    result_of,
    stop_kwargs,
)
from .retry import Retry
from .states import TERMINAL, Machine, Transition
from .step import Step
from .stops import StopRules
from .tally import Tally

# Bounds whose crossing request may have bought the final answer: the answer is taken.
PAID_FOR = ("max_tokens", "max_cost")

if TYPE_CHECKING:  # the client package imports the loop: no cycle at run time
    from .._sync import Client
    from ..runs import RunInfo


class Loop:
    """Runs a model against the daemon's tools until a stop rule or a verified answer.

    Args:
        client: the daemon connection (its identity owns the runs).
        model: anything with `respond(messages, tools, system=...) -> Turn`.
        stops: the stop rules (default `StopRules.default()`).
        verifier: checks a final answer against the run's record; None accepts it.
        on_rejected_answer: "observe" sends the verifier's finding back to the model
            (counted by the stop rules); "fail" ends the run `failed`.
        tools: the daemon tools offered to the model (None: all of them).
        reconcile_wait_s: on resume, how long to wait for a call still running.
        retry: how transient model errors (429, 5xx, connection) are retried.
        on_transition, on_event: called with each transition once it is persisted, and
            with each event of the run's tool calls as it happens (for transcripts and
            UIs; with `on_event` set a batch is streamed, Runs.Step, else answered once,
            Runs.StepBatch). The daemon's moves of a step reach `on_transition` when
            the step ends.
    """

    def __init__(
        self,
        client: Client,
        model: Model,
        *,
        stops: StopRules | None = None,
        limits: Mapping[str, Any] | None = None,
        verifier: Verifier | None = None,
        on_rejected_answer: Literal["observe", "fail"] = "observe",
        system: str = "",
        tools: Sequence[str] | None = None,
        result_cap: int = 4000,
        reconcile_wait_s: float = 60.0,
        config_version: str = "",
        retry: Retry | None = None,
        on_transition: Callable[[Transition], None] | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.client = client
        self.model = model
        self.limits = {**DEFAULT_LIMITS, **(limits or {})} if stops is None else dict(limits or {})
        self.stops = stops or StopRules.default(**stop_kwargs(self.limits))
        self._own_stops = stops is not None
        self.verifier = verifier
        self.on_rejected_answer = on_rejected_answer
        self.system = system
        self.result_cap = result_cap
        self.reconcile_wait_s = reconcile_wait_s
        self.config_version = config_version
        self.retry = retry if retry is not None else Retry()
        # Watchers (a UI, a transcript): each transition once persisted, each call event.
        self.on_transition = on_transition
        self.on_event = on_event
        self._tool_names = tools
        self._tools: list[ModelTool] | None = None

    # -- entry points ---------------------------------------------------------------

    def run(self, goal: str, *, run_id: str = "") -> LoopResult:
        with TRACER.start_as_current_span("execgate.run") as span:
            result = self._run(goal, run_id)
            close_span(span, result)
            return result

    def _run(self, goal: str, run_id: str) -> LoopResult:
        info = self.client.runs.start(
            goal,
            run_id=run_id,
            limits=self.limits,
            model=getattr(self.model, "name", type(self.model).__name__),
            config_version=self.config_version,
            labels={"client": "python"},
            # The run works where the client's calls do ("": its owner's first workspace).
            workspace=self.client.workspace,
        )
        machine = Machine(info.run_id)
        step = Step(self, info, machine, _fresh(goal, info), self.stops, self.limits)
        return step.go()

    def resume(self, run_id: str) -> LoopResult:
        """Continue a recorded run from its transitions and its calls in the journal."""
        with TRACER.start_as_current_span(
            "execgate.run", attributes={"execgate.resumed": True}
        ) as span:
            result = self._resume(run_id)
            close_span(span, result)
            return result

    def _resume(self, run_id: str) -> LoopResult:
        detail = self.client.runs.get(run_id)
        machine = Machine.replay(run_id, detail.events)
        if machine.state in TERMINAL:
            return result_of(run_id, detail.events)
        outcomes = {c.call_id: c.outcome for c in detail.calls if c.outcome is not None}
        tally = Tally(started_at=monotonic_start(detail.run.created_at))
        if (ask := detail.run.cancel) is not None:  # asked while no client was running it
            tally.request_cancel(ask.requester, ask.reason, ask.at)
        rebuilt = rebuild(detail.run.goal, detail.events, outcomes, tally, self.result_cap)
        # The run keeps the bounds it was started with (unless this Loop brings rules).
        limits = self.limits if self._own_stops else detail.run.limits
        stops = self.stops if self._own_stops else StopRules.default(**stop_kwargs(limits))
        step = Step(self, detail.run, machine, rebuilt.conversation, stops, limits)
        return step.go(rebuilt)

    def offered(self) -> list[ModelTool]:
        if self._tools is None:
            specs = self.client.list_tools()
            wanted = self._tool_names
            self._tools = [
                ModelTool(s.name, s.description, s.input_schema)
                for s in specs
                if wanted is None or s.name in wanted
            ]
        return self._tools


def _fresh(goal: str, info: RunInfo) -> Conversation:
    return Conversation([Message("user", goal)], Tally(started_at=monotonic_start(info.created_at)))
