"""One run of the `Loop` in progress: the cycle of model request, validation and tool
batch, and the moves that persist each step (see `driver` for the state machine).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import StatusCode

from ..errors import RunRefused
from ..models.base import Turn
from ..types import Outcome
from .backing import FAIL_RULES as ENDING_RULES
from .backing import UNVERIFIED, Path, Verification, caveats, fail_reason, path_of, verifier_name
from .batch import pending_calls, reconcile, to_call
from .gate import check_calls
from .record import (
    APPROVALS_SETTLED,
    BATCH_FINISHED,
    Conversation,
    Planned,
    Rebuilt,
    Refused,
    actions,
    sent,
    stopped_calls,
    turn_json,
)
from .results import (
    TRACER,
    LoopResult,
    SoFar,
    Verdict,
    result_from,
    usage_attributes,
)
from .retry import ask
from .states import Machine, State, Transition
from .stops import Cancelled, Stop, StopRules

if TYPE_CHECKING:
    from ..runs import RunInfo
    from .driver import Loop

# Bounds whose crossing request may have bought the final answer: the answer is taken.
PAID_FOR = ("max_tokens", "max_cost")


class Step:
    """One run in progress: the machine, the conversation, and the daemon's view."""

    def __init__(
        self,
        loop: Loop,
        info: RunInfo,
        machine: Machine,
        conv: Conversation,
        stops: StopRules,
        limits: Mapping[str, Any],
    ) -> None:
        self.loop = loop
        self.client = loop.client
        self.info = info
        self.run_id = info.run_id
        self.machine = machine
        # Transitions made but not yet appended (see `_move`'s `hold`), and the machine
        # as the daemon last accepted it.
        self._held: list[Transition] = []
        self._synced = copy.copy(machine)
        self.conv = conv
        self.stops = stops
        deadline_s = limits.get("deadline_seconds")
        self.deadline = info.created_at + deadline_s if deadline_s else None

    def go(self, rebuilt: Rebuilt | None = None) -> LoopResult:
        if rebuilt is not None and (ended := self._continue(rebuilt)) is not None:
            return ended
        if self.machine.state is State.CREATED:
            self._move(State.REQUESTING_MODEL, "run started")
        while True:
            ended = self._cycle()
            if ended is not None:
                return ended

    def _cycle(self) -> LoopResult | None:
        """One model request and what follows from it."""
        if (stop := self._stop()) is not None:
            return self._end(stop)
        with TRACER.start_as_current_span("execgate.model_request") as span:
            span.set_attribute("gen_ai.request.model", getattr(self.loop.model, "name", ""))
            asked = ask(
                lambda: self.loop.model.respond(
                    self.conv.messages, self.loop.offered(), system=self.loop.system
                ),
                self.loop.retry,
                check_stop=self._stop,
                deadline=self.deadline,
            )
            retries: dict[str, Any] = (
                {"retries": [a.to_json() for a in asked.retries]} if asked.retries else {}
            )
            if asked.stopped is not None:
                return self._end(asked.stopped, extra=retries)
            if asked.turn is None:
                exc = asked.error
                span.set_status(StatusCode.ERROR, type(exc).__name__)
                failed = {"error": str(exc), **retries}
                return self._fail("model_error", f"the model failed: {exc}", failed)
            turn = asked.turn
            span.set_attributes(usage_attributes(turn))
        self.conv.add_turn(turn)
        # A final answer's move is appended at once: its reply may carry a cancel
        # request, which must win over completing. Calls' moves wait for the next one.
        self._move(
            State.VALIDATING,
            "model replied",
            turn_json(turn) | retries,
            hold=path_of(turn) is Path.CALLS,
        )
        return self._validate(turn)

    def _validate(self, turn: Turn) -> LoopResult | None:
        # A bound the model request just crossed (tokens, cost), the clock or a cancel
        # ends the run before its calls are sent: reaching a bound is never `completed`.
        # An answer the crossing request already bought is the exception: it is taken
        # (verified as usual), the overrun recorded. max_steps counts model requests:
        # checked before the next one.
        path = path_of(turn)
        stop = self._stop(skip=("max_steps",))
        if stop is not None and not (path is Path.ANSWER and stop.rule in PAID_FOR):
            return self._end(stop, unrun=turn)
        match path:
            case Path.ANSWER:
                return self._answer(turn.text, overrun=stop)
            case Path.FAIL:
                return self._turn_failed(turn)
            case Path.CONTINUE:
                self._move(State.REQUESTING_MODEL, "the model paused its turn", {"paused": True})
                return None
            case Path.CALLS:
                pass
        offered = {t.name for t in self.loop.offered()}
        planned, refused = check_calls(turn, offered, self.conv, self.client, self.run_id)
        if not planned:
            data = {"refused": [r.to_json() for r in refused]}
            self._move(State.REQUESTING_MODEL, "every proposed call was refused", data)
            self.conv.add_results(turn, refused, {}, self.loop.result_cap)
            return None
        data = {"calls": [p.to_json() for p in planned], "refused": [r.to_json() for r in refused]}
        with TRACER.start_as_current_span("execgate.tool_batch") as span:
            span.set_attribute("execgate.batch.calls", len(planned))
            outcomes = self._step(f"{len(planned)} call(s) sent", data, planned)
        self.conv.add_results(turn, refused, sent(planned, outcomes), self.loop.result_cap)
        return None  # the stop rules look at the batch before the next model request

    def _step(
        self, reason: str, data: Mapping[str, Any], planned: Sequence[Planned]
    ) -> dict[str, Outcome]:
        """`validating -> running_tools` (with the turn's move held for it) and the batch,
        in one round trip (Runs.Step): the daemon records the moves, the batch's end and
        any approval waits, before it answers, as `_batch_done` and `_move` would."""
        self._held.append(self.machine.advance(State.RUNNING_TOOLS, reason, data))
        opening, self._held = self._held, []
        calls = [to_call(self.run_id, p) for p in planned]
        try:
            done = self.client.runs.step(
                self.run_id, opening, calls, deadline=self.deadline, on_event=self.loop.on_event
            )
        except RunRefused:
            self.machine = copy.copy(self._synced)  # back to what the daemon has
            raise
        for moved in done.events:
            self.machine.record(moved)  # checked: the daemon's moves continue ours
        self._persisted([*opening, *done.events], done.run)
        return {p.call_id: o for p, o in zip(planned, done.outcomes, strict=True)}

    def _turn_failed(self, turn: Turn) -> LoopResult:
        """A truncated, refused or unreadable turn: the run ends `failed` with its rule;
        its calls (their arguments may be cut off) never run."""
        data: dict[str, Any] = {"stop_reason": turn.stop_reason, "text": turn.text}
        if turn.tool_calls:
            data["not_run"] = [{"name": c.name, "arguments": c.arguments} for c in turn.tool_calls]
        return self._fail(ENDING_RULES[turn.ending], fail_reason(turn), data)

    def _batch_done(
        self,
        turn: Turn,
        planned: Sequence[Planned],
        refused: Sequence[Refused],
        outcomes: Mapping[str, Outcome],
    ) -> None:
        """A resumed batch's end, appended by the loop: the record the daemon writes at
        the end of a live step (executor/runs/steps.py), with the reconciled outcomes."""
        ran = sent(planned, outcomes)
        self.conv.add_results(turn, refused, ran, self.loop.result_cap)
        if self.machine.state is State.AWAITING_APPROVAL:
            self._move(State.RUNNING_TOOLS, APPROVALS_SETTLED)
        results = [
            {"call_id": p.call_id, "status": o.status.value, "error_class": o.error_class}
            for p, o in ran.values()
        ]
        self._move(State.REQUESTING_MODEL, BATCH_FINISHED, {"results": results})

    def _answer(self, answer: str, overrun: Stop | None = None) -> LoopResult | None:
        verdict = self._verify(answer)
        if verdict.accepted:
            pending = pending_calls(self.client, self.run_id)
            if not pending:
                return self._complete(answer, verdict, overrun)
            verdict = Verdict(False, f"calls still pending: {', '.join(pending)}")
        if self.loop.on_rejected_answer == "fail":
            name = verifier_name(self.loop.verifier) if self.loop.verifier else ""
            check = Verification(name, False, verdict.finding).to_json()
            return self._fail(
                "verifier", verdict.finding, {"answer": answer, "verification": check}
            )
        self._move(State.REQUESTING_MODEL, "answer not accepted", {"finding": verdict.finding})
        self.conv.add_finding(verdict.finding)
        return None

    def _complete(self, answer: str, verdict: Verdict, overrun: Stop | None) -> LoopResult:
        figures = self._figures()
        if overrun is not None:  # paid for before the bound was seen: recorded, not hidden
            figures["overrun"] = {"rule": overrun.rule, **overrun.evidence}
        verifier = self.loop.verifier
        checked = (
            UNVERIFIED
            if verifier is None
            else Verification(verifier_name(verifier), True, verdict.finding)
        )
        data = {
            "answer": answer,
            "figures": figures,
            "actions": actions(self.conv),
            "verification": checked.to_json(),
            "caveats": caveats(self.conv.done),
        }
        return self._terminal(State.COMPLETED, "final answer accepted", data, answer=answer)

    def _verify(self, answer: str) -> Verdict:
        if self.loop.verifier is None:
            return Verdict(True)
        calls = tuple((p.tool, p.arguments, o) for p, o in self.conv.done)
        return self.loop.verifier(SoFar(self.info.goal, answer, calls))

    # -- resume ---------------------------------------------------------------------

    def _continue(self, rebuilt: Rebuilt) -> LoopResult | None:
        """Pick up a recorded run where it stood."""
        state = self.machine.state
        if state is State.WAITING:
            assert self.machine.suspended_from is not None
            self._move(self.machine.suspended_from, "resumed")  # RESUME_INTO
            state = self.machine.state
        if state is State.VALIDATING and rebuilt.turn is not None:
            return self._validate(rebuilt.turn)
        if state in (State.RUNNING_TOOLS, State.AWAITING_APPROVAL) and rebuilt.turn is not None:
            outcomes = reconcile(
                self.client,
                self.run_id,
                rebuilt.planned,
                wait_s=self.loop.reconcile_wait_s,
                deadline=self.deadline,
            )
            self._batch_done(rebuilt.turn, rebuilt.planned, rebuilt.refused, outcomes)
        return None

    # -- moving and ending ---------------------------------------------------------

    def _move(
        self, to: State, reason: str, data: Mapping[str, Any] | None = None, *, hold: bool = False
    ) -> None:
        """Advance and persist before anything else happens; note any cancel request.

        `hold`: the next step is local (validating a turn touches nothing outside), so the
        move is appended together with the one that follows it -- before any call is sent
        or the run ends. A client dying in between loses the model's turn, never an action:
        resume asks the model again. One fsync'd append per step saved.
        """
        self._held.append(self.machine.advance(to, reason, data))
        if hold:
            return
        moved, self._held = self._held, []
        try:
            info = self.client.runs.append(self.run_id, moved)
        except RunRefused:
            self.machine = copy.copy(self._synced)  # back to what the daemon has
            raise
        self._persisted(moved, info)

    def _persisted(self, moved: Sequence[Transition], info: RunInfo) -> None:
        """The daemon holds `moved` now: tell the watchers; note any cancel request."""
        self.info = info
        self._synced = copy.copy(self.machine)
        for each in moved:
            if self.loop.on_transition is not None:
                self.loop.on_transition(each)
        if self.info.cancel is not None:
            c = self.info.cancel
            self.conv.tally.request_cancel(c.requester, c.reason, c.at)

    def _stop(self, skip: tuple[str, ...] = ()) -> Stop | None:
        return self.stops.first(self.conv.tally, time.monotonic(), skip=skip)

    def _end(
        self, stop: Stop, unrun: Turn | None = None, extra: Mapping[str, Any] | None = None
    ) -> LoopResult:
        data: dict[str, Any] = {
            "rule": stop.rule,
            "figures": stop.figures,
            "evidence": stop.evidence,
            "last_action": self.conv.tally.last_action,
            **(extra or {}),
        }
        if unrun is not None and unrun.tool_calls:  # proposed, never sent
            data["not_run"] = [{"name": c.name, "arguments": c.arguments} for c in unrun.tool_calls]
        if stop.state is State.CANCELLED:
            data["stopped_calls"] = stopped_calls(self.conv)
            data["rolled_back"] = False  # stopping undoes nothing a call already did
        return self._terminal(stop.state, stop.reason, data, rule=stop.rule)

    def _fail(self, rule: str, reason: str, extra: Mapping[str, Any]) -> LoopResult:
        data = {"rule": rule, "figures": self._figures(), **extra}
        data["last_action"] = self.conv.tally.last_action
        return self._terminal(State.FAILED, reason, data, rule=rule)

    def _terminal(
        self, state: State, reason: str, data: dict[str, Any], *, rule: str = "", answer: str = ""
    ) -> LoopResult:
        try:
            self._move(state, reason, data)
        except RunRefused as exc:
            # Someone asked the run to stop after our last append: that wins.
            if exc.kind != "cancel_requested" or state is State.CANCELLED:
                raise
            return self._cancelled_meanwhile()
        return result_from(self.run_id, state, reason, data)

    def _cancelled_meanwhile(self) -> LoopResult:
        ask = self.client.runs.get(self.run_id).run.cancel
        assert ask is not None  # the daemon refused `completed` because of it
        self.conv.tally.request_cancel(ask.requester, ask.reason, ask.at)
        stop = Cancelled().check(self.conv.tally, time.monotonic())
        assert stop is not None
        return self._end(stop)

    def _figures(self) -> dict[str, Any]:
        return self.conv.tally.figures(time.monotonic())
