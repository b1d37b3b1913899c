"""Quotas: the policy's per-agent limits (`quotas:`) applied to calls joining the lock queue.

    queued      calls of the agent admitted here that have not started (waiting for a
                rate token, a concurrent slot or their locks): at the limit, REJECTED
    per_second  a generic cell rate algorithm per agent (a token bucket of `burst`):
                `wait` reserves the next slot and sleeps until it, `reject` refuses a
                call that is early
    concurrent  the lock manager's cap (`LockBackend.acquire(cap=)`) keeps a call past
                it waiting, holding nothing; with `over: reject` a call that would wait
                for it (the agent's running and waiting calls at the limit) is REJECTED

Refusals are REJECTED `resource_exhausted` naming the limit's policy field
(`quotas[1].queued`); the scheduler journals them like every refusal. State is kept
only for agents with a call here or a rate reservation in the future.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.policy import Bound, Over, Quota


@dataclass(slots=True)
class _Agent:
    queued: int = 0
    running: int = 0
    # The rate's theoretical arrival time (monotonic): when the next call conforms.
    due: float = 0.0


class Quotas:
    """Per-agent counts and rate reservations. Used from the event loop only."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._agents: dict[str, _Agent] = {}

    def admit(self, agent: str, quota: Quota) -> Ticket:
        """Count a call joining the queue; its ticket says how long it must wait for its
        rate slot, and is told when the call starts and ends.

        Raises the REJECTED ToolError of a call over `queued`, or over `concurrent`
        or `per_second` with `over: reject`; nothing is counted then.
        """
        state = self._agents.get(agent) or _Agent()
        if quota.queued is not None and state.queued >= quota.queued.value:
            raise _over(quota.queued, f"agent {agent!r} has {state.queued} calls waiting to start")
        busy = state.queued + state.running
        if _rejects(quota.concurrent) and quota.concurrent and busy >= quota.concurrent.value:
            raise _over(quota.concurrent, f"agent {agent!r} has {busy} calls running or waiting")
        delay = self._reserve(state, quota)
        self._agents[agent] = state
        state.queued += 1
        return Ticket(self, agent, delay)

    def _reserve(self, state: _Agent, quota: Quota) -> float:
        """Take the call's slot of the agent's rate: the seconds until it is due."""
        rate = quota.per_second
        if rate is None:
            return 0.0
        now, interval = self._now(), 1.0 / rate.value
        due = max(state.due, now)
        delay = due - now - (quota.bucket - 1) * interval
        if delay > 0 and rate.over is Over.REJECT:
            raise _over(rate, f"calls come faster than {rate.value:g} per second")
        state.due = due + interval
        return max(delay, 0.0)

    def _started(self, agent: str) -> None:
        state = self._agents[agent]
        state.queued -= 1
        state.running += 1

    def _left(self, agent: str, *, started: bool) -> None:
        state = self._agents[agent]
        if started:
            state.running -= 1
        else:
            state.queued -= 1
        if not state.queued and not state.running and state.due <= self._now():
            del self._agents[agent]  # nothing to remember: memory follows the calls here

    def counts(self, agent: str) -> tuple[int, int]:
        """(waiting, running) calls of the agent here (for tests and status)."""
        state = self._agents.get(agent)
        return (state.queued, state.running) if state else (0, 0)


class Ticket:
    """One admitted call's place in its agent's counts."""

    __slots__ = ("_agent", "_quotas", "delay", "state")

    def __init__(self, quotas: Quotas, agent: str, delay: float) -> None:
        self._quotas = quotas
        self._agent = agent
        # Seconds until the call's rate slot (0: now).
        self.delay = delay
        # queued -> running -> ended (or queued -> ended).
        self.state = "queued"

    async def pace(self, cancel: asyncio.Event) -> bool:
        """Wait for the rate slot; False if `cancel` was set first."""
        if self.delay <= 0:
            return not cancel.is_set()
        try:
            await asyncio.wait_for(cancel.wait(), self.delay)
        except TimeoutError:
            return True
        return False

    def start(self) -> None:
        """The call got its locks: it runs."""
        if self.state == "queued":
            self.state = "running"
            self._quotas._started(self._agent)

    def end(self) -> None:
        """The call has ended (run, or never started); idempotent."""
        if self.state != "ended":
            self._quotas._left(self._agent, started=self.state == "running")
            self.state = "ended"


def _rejects(bound: Bound | None) -> bool:
    return bound is not None and bound.over is Over.REJECT


def _over(bound: Bound, what: str) -> ToolError:
    return ToolError(
        ErrorClass.RESOURCE_EXHAUSTED,
        f"{what}; the policy's {bound.field} is {bound.value:g}",
        field=bound.field,
        status=Status.REJECTED,
    )
