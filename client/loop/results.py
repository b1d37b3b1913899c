"""What a run of the loop hands back, and the small conversions around it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import StatusCode

from execgate.v1.runstates import LIMIT_KEYS

from ..models.base import Turn
from ..types import Outcome
from .backing import Verification
from .states import State, Transition

# StopRules.default's bounds, recorded with the run when no limits override them.
DEFAULT_LIMITS = {"max_steps": 50, "max_consecutive_errors": 5, "max_repeats": 3}


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verifier's answer: accept the final answer, or say what is wrong with it."""

    accepted: bool
    finding: str = ""


@dataclass(frozen=True, slots=True)
class SoFar:
    """What a verifier sees: the goal, the proposed answer, every call that ran."""

    goal: str
    answer: str
    calls: tuple[tuple[str, dict[str, Any], Outcome], ...]


Verifier = Callable[[SoFar], Verdict]


@dataclass(frozen=True, slots=True)
class LoopResult:
    run_id: str
    state: State
    # The terminal transition's reason, and the stop rule that decided ("" if none did).
    reason: str
    rule: str = ""
    answer: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    # On `completed`: whether a verifier backed the answer (None on other ends).
    verification: Verification | None = None
    # On `completed`: what a reader should know (failed calls, unknown outcomes).
    caveats: tuple[str, ...] = ()

    @property
    def completed(self) -> bool:
        return self.state is State.COMPLETED

    @property
    def verified(self) -> bool:
        return self.verification is not None and self.verification.verified


TRACER = trace.get_tracer("execgate.client.loop")


def close_span(span: trace.Span, result: LoopResult) -> None:
    """The run span's outcome: its id, terminal state and the rule that ended it."""
    span.set_attributes(
        {
            "execgate.run_id": result.run_id,
            "execgate.run.state": result.state.value,
            "execgate.run.reason": result.reason,
            "execgate.stop.rule": result.rule,
            "execgate.run.steps": int(result.figures.get("steps", 0)),
        }
    )
    if not result.completed:
        span.set_status(StatusCode.ERROR, result.state.value)


def usage_attributes(turn: Turn) -> dict[str, Any]:
    return {
        "gen_ai.usage.input_tokens": turn.usage.input_tokens,
        "gen_ai.usage.output_tokens": turn.usage.output_tokens,
        "execgate.cost": turn.usage.cost,
        "execgate.turn.calls": len(turn.tool_calls),
        "execgate.turn.final": turn.final,
    }


def monotonic_start(created_at: float) -> float:
    """The run's start on the monotonic clock (the deadline counts from its creation)."""
    return time.monotonic() - max(time.time() - created_at, 0.0)


# The run limits (runs.proto RunLimits; runstates.json `limit_keys`) and the
# StopRules.default keyword each sets: its own name but for the deadline's.
_RENAMED = {"deadline_seconds": "deadline_s"}
STOP_KWARGS = {k: _RENAMED.get(k, k) for k in LIMIT_KEYS}


def stop_kwargs(limits: Mapping[str, Any]) -> dict[str, Any]:
    return {STOP_KWARGS[k]: v for k, v in limits.items() if k in STOP_KWARGS}


def result_of(run_id: str, events: Sequence[Transition]) -> LoopResult:
    last = events[-1]
    return result_from(run_id, last.to_state, last.reason, last.data)


def result_from(run_id: str, state: State, reason: str, data: Mapping[str, Any]) -> LoopResult:
    """The result a terminal transition's data describes."""
    return LoopResult(
        run_id,
        state,
        reason,
        str(data.get("rule", "")),
        str(data.get("answer", "")),
        dict(data.get("figures", {})),
        dict(data.get("evidence", {})),
        Verification.from_json(data.get("verification")),
        tuple(str(c) for c in data.get("caveats", ())),
    )
