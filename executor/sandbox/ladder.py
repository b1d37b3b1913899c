"""The cancellation ladder: ask, wait the grace period, force, reap, verify.

One procedure for every sandbox backend and for both causes of a stop (a Cancel
request, or a deadline). Each step is a timeline mark with its own time:

    CANCEL_REQUESTED  when the stop was asked for (the RPC's arrival or the deadline)
    SIGNAL_SENT       the polite signal (SIGTERM to the group / namespace / container)
    GRACE_EXPIRED     the grace period ran out with something still alive
    FORCE_TERMINATED  everything the call started was killed
    STOPPED           the last process was seen gone (detail: what survived, if anything)

A call whose main process and every process it started are gone within the
grace period stopped COOPERATIVE; otherwise FORCE_TERMINATED.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from execgate.executor.core import clock
from execgate.executor.core.outcomes import ErrorClass, Mark, Phase, StopMode, mark

from . import Exit, Running


class CancelScope:
    """Set when the call must stop; tools that run long poll or await it.

    Invariant: `reason` is non-empty exactly when `requested` is set, and
    `requested_at` is then the wall-clock time the stop was asked for (the Cancel
    RPC's arrival, not the moment a tool noticed).
    """

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        # Set on the daemon's second shutdown signal: end any grace period now.
        self.forced = asyncio.Event()
        self.reason = ""
        self.requester = ""
        self.requested_at = 0.0
        # The stop is a deadline (timeout), not a Cancel.
        self.timed_out = False
        # Grace asked for by the canceller (seconds); None: the daemon's default.
        self.grace: float | None = None

    def cancel(
        self,
        reason: str,
        grace: float | None = None,
        *,
        requester: str = "",
        at: float | None = None,
        timed_out: bool = False,
    ) -> None:
        if not self.requested.is_set():
            self.reason = reason or "cancelled"
            self.requester = requester
            self.timed_out = timed_out
            self.requested_at = clock.now() if at is None else at
            self.grace = grace
            self.requested.set()

    def force(self, reason: str) -> None:
        """Stop now: no (further) grace."""
        self.cancel(reason, 0.0)
        self.forced.set()


# How long to wait, after force, for the kernel to reap every process of the call.
REAP_SECONDS = 5.0
POLL_SECONDS = 0.01


@dataclass(frozen=True, slots=True)
class Stopped:
    how: StopMode
    # NONE (ran to its end), CANCELLED or TIMEOUT.
    reason: ErrorClass
    exit: Exit
    marks: tuple[Mark, ...] = ()
    # Processes of the call still alive after the ladder; None: not checked (completed).
    survivors: int | None = None


async def supervise(
    running: Running,
    scope: CancelScope,
    *,
    time_limit: float,
    grace: float,
    max_grace: float,
    nominal: float | None = None,
) -> Stopped:
    """Wait for the call to end by itself, or stop it on cancel or at the deadline.

    `time_limit` is the time left from now; `nominal` the call's timeout as asked
    (for the timeline). `grace` is the default grace period; a canceller may ask
    for another, up to `max_grace`.
    """
    started = clock.now()
    waiter = asyncio.ensure_future(running.wait())
    asked = asyncio.ensure_future(scope.requested.wait())
    try:
        done, _ = await asyncio.wait(
            {waiter, asked}, timeout=time_limit, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter in done:
            await running.finish()
            return Stopped(StopMode.COMPLETED, ErrorClass.NONE, waiter.result())
        if asked in done:
            reason = ErrorClass.TIMEOUT if scope.timed_out else ErrorClass.CANCELLED
            first = Mark(Phase.CANCEL_REQUESTED, scope.requested_at, _who(scope))
        else:
            reason = ErrorClass.TIMEOUT
            limit = nominal if nominal is not None else time_limit
            first = Mark(Phase.CANCEL_REQUESTED, started + time_limit, f"timeout after {limit:g}s")
        grace = grace_for(scope, grace, max_grace)
        return await _ladder(running, waiter, scope, grace, reason, first)
    finally:
        asked.cancel()
        if not waiter.done():
            waiter.cancel()


async def _ladder(
    running: Running,
    waiter: asyncio.Future[Exit],
    scope: CancelScope,
    grace: float,
    reason: ErrorClass,
    first: Mark,
) -> Stopped:
    marks = [first, mark(Phase.SIGNAL_SENT, await running.terminate())]
    expires = time.monotonic() + grace
    gone_at = await _all_gone(running, waiter, scope, expires)
    if gone_at is not None:
        await running.finish()
        # (Not before the signal: a process that ended just before it was not stopped by it.)
        at = max(gone_at, marks[-1].at)
        marks.append(Mark(Phase.STOPPED, at, "every process exited within the grace period"))
        return Stopped(StopMode.COOPERATIVE, reason, waiter.result(), tuple(marks), 0)
    expired = "forced: no grace" if scope.forced.is_set() else f"after {grace:g}s"
    marks.append(mark(Phase.GRACE_EXPIRED, expired))
    marks.append(mark(Phase.FORCE_TERMINATED, await running.kill()))
    left = await _reaped(running, waiter)
    detail = f"{len(left)} survived: {left[:10]}" if left else "no process of the call is left"
    marks.append(mark(Phase.STOPPED, detail))
    ended = waiter.result() if waiter.done() else Exit(None)
    return Stopped(StopMode.FORCE_TERMINATED, reason, ended, tuple(marks), len(left))


async def _all_gone(
    running: Running, waiter: asyncio.Future[Exit], scope: CancelScope, expires: float
) -> float | None:
    """When the main process exited with nothing of the call left, if before `expires`."""
    forced: asyncio.Future[Any] = asyncio.ensure_future(scope.forced.wait())
    try:
        remaining = expires - time.monotonic()
        if remaining > 0:
            await asyncio.wait(
                {waiter, forced}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
        if not waiter.done() or scope.forced.is_set():
            return None
        # The backend may know when the main process ended better than "now".
        first = waiter.result().at or clock.now()
        while not scope.forced.is_set():
            left = await _survivors_by(running, expires)
            if left == []:
                return first
            if left is None or time.monotonic() >= expires:
                return None
            # Stragglers (a process being reaped): gone only when seen gone. Every backend
            # answers this from a pidfd, a cgroup leaf or a host's report, not a /proc
            # scan, once the main process is gone: a short poll costs little.
            await asyncio.sleep(min(POLL_SECONDS, max(expires - time.monotonic(), 0)))
            first = clock.now()
        return None
    finally:
        forced.cancel()


async def _survivors_by(running: Running, expires: float) -> list[int] | None:
    """What is left of the call, or None if the scan did not answer before `expires`.

    A slow /proc scan (a machine under load) must not stretch the grace period.
    """
    remaining = max(expires - time.monotonic(), POLL_SECONDS)
    try:
        return await asyncio.wait_for(running.survivors(), timeout=remaining)
    except TimeoutError:
        return None


async def _reaped(running: Running, waiter: asyncio.Future[Exit]) -> list[int]:
    """Wait for the main process and every other process of the call to be gone."""
    deadline = time.monotonic() + REAP_SECONDS
    await asyncio.wait({waiter}, timeout=REAP_SECONDS)
    while True:
        left = await running.survivors()
        if not left or time.monotonic() >= deadline:
            return left
        await running.kill()  # a process forked while we killed: again
        await asyncio.sleep(POLL_SECONDS)


def _who(scope: CancelScope) -> str:
    by = f" (requested by {scope.requester})" if scope.requester else ""
    return f"{scope.reason}{by}"


def grace_for(scope: CancelScope, default: float, cap: float) -> float:
    """The grace period this stop gets: the canceller's (capped) or the default."""
    if scope.forced.is_set():
        return 0.0
    asked = scope.grace
    return default if asked is None else min(max(asked, 0.0), cap)
