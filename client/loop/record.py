"""What a run's transitions carry, and how a run is rebuilt from them.

`index` is the call's position in the model's turn: results are matched to proposed
calls by position, since a provider may repeat or omit its own ids.

The loop writes every fact it needs to continue into its transitions' `data`:

    requesting_model -> validating   {"turn": {"text", "calls": [{id, name, arguments}],
                                      "stop_reason"}, "usage": {input_tokens, output_tokens,
                                      cost}}
    validating -> running_tools      {"calls": [{call_id, index, model_id, tool, arguments}],
                                      "refused": [{index, model_id, tool, arguments,
                                      error_class, reason}]}
    validating -> requesting_model   {"refused": [...]}, {"finding": verifier's finding} or
                                      {"paused": true} (a pause_turn, continued)
    running_tools -> requesting_model {"results": [{call_id, status, error_class}]}
    running_tools <-> awaiting_approval  while calls of the batch wait for an approval

The daemon records the last two itself in a live step (Runs.Step, executor/runs/steps.py,
with the same reasons and data); the loop appends them only for a batch it reconciled on
resume.

Raw tool results stay in the daemon's journal (the run's calls): a rebuilt
conversation takes them from there, through the same `observe` the live loop
used, so a resumed model sees what the original one would have.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..models.base import Message, ToolCall, ToolResult, Turn, Usage
from ..types import Outcome, Status
from .observe import Observation, not_run, observe
from .states import State, Transition
from .tally import Tally, canonical_arguments, fingerprint

# The reasons of a batch's end, as the daemon records them too (executor/runs/steps.py).
BATCH_FINISHED = "batch finished"
APPROVALS_SETTLED = "approvals settled"


@dataclass(frozen=True, slots=True)
class Planned:
    """A proposed call the loop sends to the daemon."""

    call_id: str
    index: int
    model_id: str
    tool: str
    arguments: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "index": self.index,
            "model_id": self.model_id,
            "tool": self.tool,
            "arguments": self.arguments,
        }


@dataclass(frozen=True, slots=True)
class Refused:
    """A proposed call the loop refused itself; it never reached the daemon."""

    index: int
    model_id: str
    tool: str
    arguments: Any
    error_class: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "model_id": self.model_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "error_class": self.error_class,
            "reason": self.reason,
        }

    def observation(self) -> Observation:
        return not_run(self.model_id, self.tool, self.reason, self.error_class)


@dataclass(slots=True)
class Conversation:
    """The messages the model sees, and the figures the stop rules read."""

    messages: list[Message]
    tally: Tally
    # Every call that ran: (planned, outcome), for verifiers and terminal records.
    done: list[tuple[Planned, Outcome]] = field(default_factory=list)

    def add_turn(self, turn: Turn) -> None:
        self.tally.record_model(turn.usage.input_tokens, turn.usage.output_tokens, turn.usage.cost)
        self.messages.append(Message("assistant", turn.text, turn.tool_calls))

    def add_results(
        self,
        turn: Turn,
        refused: Sequence[Refused],
        ran: Mapping[int, tuple[Planned, Outcome]],
        cap: int,
    ) -> None:
        """One result per proposed call, in the model's order, all in one message.
        `ran`: the calls sent, by their position in the turn."""
        by_index = {r.index: r for r in refused}
        results = []
        for i, call in enumerate(turn.tool_calls):
            if i in by_index:
                seen = by_index[i].observation()
                self._count(call.name, call.arguments, seen)
            else:
                planned, outcome = ran[i]
                seen = observe(outcome, call.name, cap=cap)
                self._count(call.name, call.arguments, seen)
                self.done.append((planned, outcome))
            results.append(ToolResult(call.id, seen.render(), seen.is_error))
        self.messages.append(Message("tool_results", results=tuple(results)))

    def add_finding(self, finding: str) -> None:
        """The verifier did not accept the answer: its finding goes back as an observation."""
        self.tally.record_result("final_answer", {}, False, fingerprint(finding), summary=finding)
        self.messages.append(Message("user", f"Your answer was not accepted: {finding}"))

    def _count(self, tool: str, arguments: Any, seen: Observation) -> None:
        ok = not seen.is_error
        result = fingerprint([seen.status, seen.error_class, seen.text])
        summary = f"{seen.status}/{seen.error_class}"
        self.tally.record_result(tool, arguments, ok, result, summary=summary)


def actions(conv: Conversation) -> list[dict[str, Any]]:
    """What the run did, for its `completed` record."""
    return [
        {
            "call_id": p.call_id,
            "tool": p.tool,
            "arguments": canonical_arguments(p.arguments),
            "status": o.status.value,
        }
        for p, o in conv.done
    ]


def stopped_calls(conv: Conversation) -> list[dict[str, Any]]:
    """The calls a cancel reached: when it was asked, and when each actually stopped
    (two moments, recorded separately; nothing is rolled back)."""
    rows = []
    for p, o in conv.done:
        asked, stopped = o.mark("cancel_requested"), o.mark("stopped")
        if asked is None:
            continue
        rows.append(
            {
                "call_id": p.call_id,
                "tool": p.tool,
                "status": o.status.value,
                "cancel_requested_at": asked.at,
                "stopped_at": stopped.at if stopped is not None else None,
                "stopped_how": o.stopped_how.value,
            }
        )
    return rows


def turn_json(turn: Turn) -> dict[str, Any]:
    return {
        "turn": {
            "text": turn.text,
            "calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls
            ],
            "stop_reason": turn.stop_reason,
        },
        "usage": {
            "input_tokens": turn.usage.input_tokens,
            "output_tokens": turn.usage.output_tokens,
            "cost": turn.usage.cost,
        },
    }


def turn_from(data: Mapping[str, Any]) -> Turn:
    raw, usage = data["turn"], data["usage"]
    calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in raw["calls"])
    return Turn(raw["text"], calls, Usage(**usage), raw.get("stop_reason", ""))


def planned_from(data: Mapping[str, Any]) -> tuple[list[Planned], list[Refused]]:
    planned = [Planned(**c) for c in data.get("calls", [])]
    refused = [Refused(**r) for r in data.get("refused", [])]
    return planned, refused


@dataclass(slots=True)
class Rebuilt:
    """Where a recorded run stands: its conversation, and the step it was in."""

    conversation: Conversation
    # The last model turn, and the calls planned for it (when it was being validated
    # or its calls were running).
    turn: Turn | None = None
    planned: list[Planned] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)


def rebuild(
    goal: str,
    events: Iterable[Transition],
    outcomes: Mapping[str, Outcome],
    tally: Tally,
    cap: int,
) -> Rebuilt:
    """Replay the recorded transitions into a conversation. `outcomes`: the run's
    recorded call outcomes by call id (calls still unresolved are left to the caller)."""
    state = Rebuilt(Conversation([Message("user", goal)], tally))
    for moved in events:
        _replay(state, moved, outcomes, cap)
    return state


def _replay(state: Rebuilt, moved: Transition, outcomes: Mapping[str, Outcome], cap: int) -> None:
    conv = state.conversation
    if moved.from_state is State.REQUESTING_MODEL and moved.to_state is State.VALIDATING:
        state.turn = turn_from(moved.data)
        state.planned, state.refused = [], []
        conv.add_turn(state.turn)
    elif moved.from_state is State.VALIDATING and moved.to_state is State.RUNNING_TOOLS:
        state.planned, state.refused = planned_from(moved.data)
    elif moved.from_state is State.VALIDATING and moved.to_state is State.REQUESTING_MODEL:
        if moved.data.get("paused"):
            pass  # a paused turn is continued: the model is asked again as it stands
        elif "finding" in moved.data:
            conv.add_finding(str(moved.data["finding"]))
        elif state.turn is not None:
            _, refused = planned_from(moved.data)
            conv.add_results(state.turn, refused, {}, cap)
        state.turn = None
    elif moved.to_state is State.REQUESTING_MODEL and state.turn is not None:
        conv.add_results(state.turn, state.refused, sent(state.planned, outcomes), cap)
        state.turn, state.planned, state.refused = None, [], []


def sent(
    planned: Iterable[Planned], outcomes: Mapping[str, Outcome]
) -> dict[int, tuple[Planned, Outcome]]:
    """The sent calls with their outcomes, by position in the turn; a call with no
    recorded outcome (still running, or lost) is UNKNOWN_OUTCOME."""
    return {p.index: (p, outcomes.get(p.call_id) or missing(p.call_id)) for p in planned}


def missing(call_id: str) -> Outcome:
    """A call sent with no outcome in the journal (yet): its effect is not known."""
    return Outcome(
        call_id=call_id,
        status=Status.UNKNOWN_OUTCOME,
        error_class="internal",
        message="sent, but the journal has no outcome for it (still running, or lost)",
    )


def arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)
