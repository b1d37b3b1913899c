"""Retrying a model request that failed for a passing reason.

A 429, a 5xx (Anthropic's 529 among them), a 408, a refused connection or a timeout say
"later", not "never": the loop asks again after an exponential backoff with jitter,
waiting at least what the provider's `Retry-After` asked for. Any other error (400, 401,
404: a wrong request, key or model) fails the run at once. The retries are bounded three
ways: `attempts`, the run's wall clock (a wait that would pass the run's deadline is not
taken) and the stop rules (checked before each retry, so a cancel or a budget ends the run
with its own rule). Every retry goes into the run's record (`Attempt.to_json`).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..models.base import Turn
from ..models.errors import ModelError, ModelRateLimited, ModelUnavailable
from .stops import Stop

__all__ = ["Asked", "Attempt", "Retry", "ask", "retryable"]


@dataclass(frozen=True, kw_only=True)
class Retry:
    """How the loop retries a model request that failed transiently."""

    # Retries after the first request (0: never retry).
    attempts: int = 4
    # The first backoff, in seconds; each next one doubles, up to `max_s`.
    base_s: float = 0.5
    max_s: float = 20.0
    # The backoff is drawn uniformly from [(1 - jitter) * b, b], so clients that failed
    # together do not come back together.
    jitter: float = 0.5
    # Injected for tests; the real ones by default.
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    random: Callable[[], float] = field(default=random.random, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 0 or self.base_s < 0 or self.max_s < 0:
            raise ValueError("Retry: attempts, base_s and max_s cannot be negative")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"Retry.jitter must be within [0, 1], got {self.jitter}")

    def backoff(self, retry: int, error: ModelError) -> float:
        """Seconds to wait before retry number `retry` (1, 2, ...) after `error`."""
        ceiling = min(self.max_s, self.base_s * 2 ** (retry - 1))
        wait = ceiling * (1 - self.jitter * self.random())
        if isinstance(error, ModelRateLimited) and error.retry_after is not None:
            wait = max(wait, error.retry_after)  # the provider's word is a floor
        return float(wait)


def retryable(error: ModelError) -> bool:
    """A passing failure: rate limited, unavailable (5xx, 408, connection, timeout)."""
    return isinstance(error, ModelRateLimited | ModelUnavailable)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One failed model request that the loop retried (or gave up on)."""

    retry: int
    error: str
    status: int | None
    message: str
    # Seconds waited before the next request; 0 when the loop gave up instead.
    wait_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "retry": self.retry,
            "error": self.error,
            "status": self.status,
            "message": self.message,
            "wait_s": round(self.wait_s, 3),
        }


def attempt(retry: int, error: ModelError, wait_s: float) -> Attempt:
    status = 429 if isinstance(error, ModelRateLimited) else getattr(error, "status", None)
    return Attempt(retry, type(error).__name__, status, str(error)[:300], wait_s)


@dataclass(slots=True)
class Asked:
    """What came of asking the model: a turn, or the error that ended the asking, or a
    stop rule that fired between retries; and the retries made on the way."""

    turn: Turn | None = None
    error: ModelError | None = None
    stopped: Stop | None = None
    retries: list[Attempt] = field(default_factory=list)


def ask(
    request: Callable[[], Turn],
    policy: Retry,
    *,
    check_stop: Callable[[], Stop | None],
    deadline: float | None,
) -> Asked:
    """Call `request` until it answers, fails for good, or a bound says stop.

    `deadline` (time.time() seconds): a wait that would end after it is not taken.
    """
    asked = Asked()
    for retry in itertools.count(1):
        try:
            asked.turn = request()
            return asked
        except ModelError as exc:
            error = exc
        if not retryable(error) or retry > policy.attempts:
            asked.error = error
            return asked
        wait = policy.backoff(retry, error)
        if deadline is not None and time.time() + wait >= deadline:
            asked.retries.append(attempt(retry, error, 0.0))
            asked.error = error
            return asked
        asked.retries.append(attempt(retry, error, wait))
        policy.sleep(wait)
        if (stop := check_stop()) is not None:
            asked.stopped = stop
            return asked
    raise AssertionError("unreachable")  # pragma: no cover
