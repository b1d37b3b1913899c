"""Stop rules: each bound on a run is its own small object, and `StopRules` composes them.

A rule looks at the `Tally` and either stays silent or returns a `Stop`: the rule's name,
the terminal state it leads to, a sentence saying why, the run's figures and the evidence
that made it fire. Every stop maps to a named state other than `completed`: a safety bound
ends a run honestly (expired, budget_exhausted, failed, escalated, cancelled) and never turns
an unfinished run into a success.

When to check: `StopRules.first` is meant to run before each model request, the point where
the next unit of spending would happen -- so `MaxSteps(n)` means "a run may make at most n
model requests", and the token and cost budgets stop the request that would exceed them
being paid for. Cancel and deadline may also be checked anywhere else (between batches).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from execgate.v1.runstates import STOP_PRIORITY

from .states import STOPS, State
from .tally import CancelRequest, Tally, canonical_arguments, fingerprint

__all__ = [
    "PRIORITY",
    "CancelRequest",
    "Cancelled",
    "Deadline",
    "MaxConsecutiveErrors",
    "MaxCost",
    "MaxSteps",
    "MaxTokens",
    "NoProgress",
    "Stop",
    "StopRule",
    "StopRules",
    "Tally",
    "canonical_arguments",
    "fingerprint",
]


@dataclass(frozen=True)
class Stop:
    """Why a run must end now, and into which terminal state."""

    rule: str
    state: State
    reason: str
    figures: dict[str, Any]
    evidence: dict[str, Any]

    def __post_init__(self) -> None:
        if self.state not in STOPS:
            raise ValueError(f"a stop ends in one of {sorted(STOPS)}, not {self.state.value}")


class StopRule(Protocol):
    name: str

    def check(self, tally: Tally, now: float) -> Stop | None:
        """A `Stop` if the run must end; `now` is monotonic seconds, like `started_at`."""
        ...


def _positive(value: float, what: str) -> None:
    if value <= 0:
        raise ValueError(f"{what} must be positive, got {value}")


@dataclass(frozen=True)
class Cancelled:
    """An authorized actor asked the run to stop."""

    name = "cancelled"

    def check(self, tally: Tally, now: float) -> Stop | None:
        if (req := tally.cancel) is None:
            return None
        evidence = {"who": req.who, "reason": req.reason, "requested_at": req.at}
        reason = f"cancelled by {req.who}" + (f": {req.reason}" if req.reason else "")
        return Stop(self.name, State.CANCELLED, reason, tally.figures(now), evidence)


@dataclass(frozen=True)
class Deadline:
    """The run may last `seconds` of wall time from its start (monotonic clock)."""

    seconds: float
    name = "deadline"

    def __post_init__(self) -> None:
        _positive(self.seconds, "deadline seconds")

    def check(self, tally: Tally, now: float) -> Stop | None:
        elapsed = now - tally.started_at
        if elapsed < self.seconds:
            return None
        reason = f"{elapsed:.1f}s elapsed; the deadline is {self.seconds}s"
        evidence = {"limit_s": self.seconds, "elapsed_s": elapsed}
        return Stop(self.name, State.EXPIRED, reason, tally.figures(now), evidence)


@dataclass(frozen=True)
class MaxTokens:
    """The run may use `n` tokens, input and output together."""

    n: int
    name = "max_tokens"

    def __post_init__(self) -> None:
        _positive(self.n, "max_tokens")

    def check(self, tally: Tally, now: float) -> Stop | None:
        if tally.tokens < self.n:
            return None
        reason = f"{tally.tokens} tokens used; the budget is {self.n}"
        evidence = {"limit": self.n, "tokens": tally.tokens}
        return Stop(self.name, State.BUDGET_EXHAUSTED, reason, tally.figures(now), evidence)


@dataclass(frozen=True)
class MaxCost:
    """The run may cost `limit` (in whatever unit the model adapter reports)."""

    limit: float
    name = "max_cost"

    def __post_init__(self) -> None:
        _positive(self.limit, "max_cost")

    def check(self, tally: Tally, now: float) -> Stop | None:
        if tally.cost < self.limit:
            return None
        reason = f"cost {tally.cost:g} reached the budget {self.limit:g}"
        evidence = {"limit": self.limit, "cost": tally.cost}
        return Stop(self.name, State.BUDGET_EXHAUSTED, reason, tally.figures(now), evidence)


@dataclass(frozen=True)
class MaxSteps:
    """A run may make at most `n` model requests: fires once `n` have been made."""

    n: int
    name = "max_steps"

    def __post_init__(self) -> None:
        _positive(self.n, "max_steps")

    def check(self, tally: Tally, now: float) -> Stop | None:
        if tally.steps < self.n:
            return None
        reason = f"{tally.steps} model requests made; the run may make at most {self.n}"
        evidence = {"limit": self.n, "steps": tally.steps}
        return Stop(self.name, State.EXPIRED, reason, tally.figures(now), evidence)


@dataclass(frozen=True)
class MaxConsecutiveErrors:
    """`n` tool calls in a row ended in error: the run has failed."""

    n: int
    name = "max_consecutive_errors"

    def __post_init__(self) -> None:
        _positive(self.n, "max_consecutive_errors")

    def check(self, tally: Tally, now: float) -> Stop | None:
        if tally.consecutive_errors < self.n:
            return None
        count = tally.consecutive_errors
        reason = f"{count} tool calls failed in a row (at most {self.n}); last: {tally.last_result}"
        evidence = {
            "limit": self.n,
            "count": count,
            "last_action": tally.last_action,
            "last_result": tally.last_result,
        }
        return Stop(self.name, State.FAILED, reason, tally.figures(now), evidence)


@dataclass(frozen=True)
class NoProgress:
    """The same call got the same result more than `max_repeats` times: ask a human.

    Repeating a call is fine (polling, a retry after a change elsewhere); getting the same
    answer to the same question again and again is treading water.
    """

    max_repeats: int
    name = "no_progress"

    def __post_init__(self) -> None:
        _positive(self.max_repeats, "max_repeats")

    def check(self, tally: Tally, now: float) -> Stop | None:
        count = tally.repeats.get(tally.max_repeat_key, 0)
        if count <= self.max_repeats:
            return None
        evidence = dict(tally.max_repeat_evidence) | {"limit": self.max_repeats}
        reason = (
            f"{evidence['tool']} returned the same result {count} times for the same "
            f"arguments (at most {self.max_repeats} allowed)"
        )
        return Stop(self.name, State.ESCALATED, reason, tally.figures(now), evidence)


# The order in which rules decide when several fire at once: a cancel first, then time,
# tokens and cost, the step cap, and the judgements about the run's behaviour last
# (`stop_priority` in proto/execgate/v1/runstates.json says why, and is the one copy).
PRIORITY: tuple[str, ...] = STOP_PRIORITY


class StopRules:
    """Rules in `PRIORITY` order (rules with other names after them, as given)."""

    def __init__(self, rules: Sequence[StopRule]) -> None:
        names = [rule.name for rule in rules]
        if len(set(names)) != len(names):
            raise ValueError(f"one rule per name, got {names}")

        def rank(rule: StopRule) -> int:
            return PRIORITY.index(rule.name) if rule.name in PRIORITY else len(PRIORITY)

        self.rules: tuple[StopRule, ...] = tuple(sorted(rules, key=rank))

    def first(self, tally: Tally, now: float, *, skip: Collection[str] = ()) -> Stop | None:
        """The stop of the highest-priority rule that fires, or None to go on. `skip`:
        rule names not to check at this point (max_steps before a tool batch)."""
        for rule in self.rules:
            if rule.name not in skip and (stop := rule.check(tally, now)) is not None:
                return stop
        return None

    @classmethod
    def default(
        cls,
        *,
        max_steps: int | None = 50,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        deadline_s: float | None = None,
        max_consecutive_errors: int | None = 5,
        max_repeats: int | None = 3,
    ) -> StopRules:
        """The usual set; None leaves a bound out. Cancellation is always honoured."""
        rules: list[StopRule] = [Cancelled()]
        if deadline_s is not None:
            rules.append(Deadline(deadline_s))
        if max_tokens is not None:
            rules.append(MaxTokens(max_tokens))
        if max_cost is not None:
            rules.append(MaxCost(max_cost))
        if max_steps is not None:
            rules.append(MaxSteps(max_steps))
        if max_consecutive_errors is not None:
            rules.append(MaxConsecutiveErrors(max_consecutive_errors))
        if max_repeats is not None:
            rules.append(NoProgress(max_repeats))
        return cls(rules)
