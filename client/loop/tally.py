"""The run's figures: what it has spent and how its calls went, kept as separate accounts.

Steps, tokens, cost, time and failures drain at their own pace, so each is its own counter
and each has its own stop rule (`stops`). The tally also keeps the one signal most loops
omit: how often the *same* call produced the *same* result, which is what tells a run that
is treading water from one that is working.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CancelRequest", "Tally", "canonical_arguments", "fingerprint"]

# Bound on the human-readable `last_action` / `last_result` strings.
_SHORT = 200


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(text_or_obj: Any) -> str:
    """A short stable hash of a JSON value (a string is hashed as its JSON form).

    16 hex digits: collisions are not a concern for counting repeats within one run.
    Raises TypeError for values JSON cannot express.
    """
    return hashlib.sha256(_canonical(text_or_obj).encode("utf-8")).hexdigest()[:16]


def canonical_arguments(args: dict[str, Any] | str) -> str:
    """Arguments as compact, key-sorted JSON, so that equal arguments compare equal.

    A string is the model's raw JSON text: it is parsed and re-serialized; text that does
    not parse is kept as it is (it is still the same call if it comes again).
    """
    if isinstance(args, str):
        try:
            return _canonical(json.loads(args))
        except json.JSONDecodeError:
            return args
    return _canonical(args)


def _short(text: str) -> str:
    return text if len(text) <= _SHORT else text[: _SHORT - 1] + "…"


@dataclass(frozen=True)
class CancelRequest:
    """Someone authorized asked the run to stop."""

    who: str
    reason: str
    # Wall-clock seconds since the epoch: when it was asked (not when the run stopped).
    at: float


@dataclass(kw_only=True)
class Tally:
    """The figures of one run. Counters only grow; `consecutive_errors` resets on success."""

    # Monotonic seconds at the start of the run (the deadline counts from here).
    started_at: float
    # Model requests made.
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    # Invariant: consecutive_errors <= failures.
    consecutive_errors: int = 0
    failures: int = 0
    # What the run did last and how it went, short and human-readable.
    last_action: str = ""
    last_result: str = ""
    # fingerprint(tool, canonical arguments, result fingerprint) -> times seen.
    repeats: dict[str, int] = field(default_factory=dict)
    # Invariant: "" iff repeats is empty; otherwise a key with the highest count, and
    # max_repeat_evidence describes it (tool, arguments, result, count).
    max_repeat_key: str = ""
    max_repeat_evidence: dict[str, Any] = field(default_factory=dict)
    cancel: CancelRequest | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def record_model(self, usage_input: int, usage_output: int, cost: float) -> None:
        """One model request was made and answered, with its usage."""
        if usage_input < 0 or usage_output < 0 or cost < 0:
            raise ValueError("usage and cost cannot be negative")
        self.steps += 1
        self.input_tokens += usage_input
        self.output_tokens += usage_output
        self.cost += cost
        self.last_action = "model request"
        self.last_result = f"{usage_input} tokens in, {usage_output} out"

    def record_result(
        self,
        tool: str,
        arguments: dict[str, Any] | str,
        ok: bool,
        result_fingerprint: str,
        *,
        summary: str = "",
    ) -> None:
        """One tool call ended. `summary` (e.g. "failure/not_found") is for people."""
        args = canonical_arguments(arguments)
        self.last_action = _short(f"tool {tool} {args}")
        self.last_result = _short(summary or ("ok" if ok else "error"))
        if ok:
            self.consecutive_errors = 0
        else:
            self.consecutive_errors += 1
            self.failures += 1
        self._count_repeat(tool, args, result_fingerprint)

    def _count_repeat(self, tool: str, args: str, result: str) -> None:
        key = fingerprint([tool, args, result])
        count = self.repeats.get(key, 0) + 1
        self.repeats[key] = count
        if key == self.max_repeat_key or count > self.repeats.get(self.max_repeat_key, 0):
            self.max_repeat_key = key
            self.max_repeat_evidence = {
                "tool": tool,
                "arguments": args,
                "result": result,
                "count": count,
            }

    def request_cancel(self, who: str, reason: str, at: float) -> None:
        """Record a cancel request; the first one stands (it is the one that stopped the run)."""
        if self.cancel is None:
            self.cancel = CancelRequest(who, reason, at)

    def figures(self, now: float) -> dict[str, Any]:
        """The figures a stop records, `now` on the same monotonic clock as `started_at`."""
        return {
            "steps": self.steps,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "tokens": self.tokens,
            "cost": self.cost,
            "elapsed_s": round(now - self.started_at, 3),
            "failures": self.failures,
            "consecutive_errors": self.consecutive_errors,
            "last_action": self.last_action,
            "last_result": self.last_result,
        }
