"""The in-process lock manager: one daemon, many concurrent calls.

An uncontended `acquire` is a few dictionary lookups and returns without
creating a future or a task; only a call that has to wait gets a future (and,
when it can be cancelled, one helper task that waits on the cancel event).
Grants follow `decide`: all locks at once, in fair order per conflict (each
agent's calls in arrival order, agents taking turns), within each agent's cap.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .base import Abandoned, BackendClosed, Lease, LockEntry, Snapshot, WaitInfo
from .decide import Ask, LockTable, Turns, admissible, decide, entries, under_cap, wait_info
from .keys import Key
from .modes import LockMode, plans_conflict


class _Waiter:
    __slots__ = ("ask", "future", "owner", "plan", "rank")

    def __init__(
        self, owner: str, plan: Mapping[Key, LockMode], ask: Ask, rank: tuple[int, int]
    ) -> None:
        self.owner = owner
        self.plan = plan
        self.ask = ask
        # (tag, arrival): its place in the fair order (decide.Turns).
        self.rank = rank
        # Invariant: pending while the waiter is in the queue; only the manager
        # completes it (result: the Lease; exception: BackendClosed).
        self.future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()


class LockManager:
    """Multi-granularity locks for the calls of one daemon (the default backend).

    Use it from the event loop's thread only: `Lease.release` wakes waiters
    through their futures.
    """

    def __init__(self) -> None:
        # Invariant: `_held` is exactly the union of the entries of `_holders`, and
        # `_running` counts the holders per flow (flows holding nothing are absent).
        self._held = LockTable()
        self._holders: dict[Lease, Ask] = {}
        self._running: dict[str, int] = {}
        # Invariant: `_queue` is sorted by rank (the fair order), `_waiting` is
        # exactly the union of its entries, `_turns` counts its waiters per flow,
        # and after every change no queued waiter is grantable: grants are made as
        # soon as they are possible.
        self._waiting = LockTable()
        self._queue: list[_Waiter] = []
        self._turns = Turns()
        self._arrivals = itertools.count()
        self._closed = False

    async def acquire(
        self,
        owner: str,
        plan: Mapping[Key, LockMode],
        *,
        cancel: asyncio.Event | None = None,
        on_wait: Callable[[WaitInfo], None] | None = None,
        flow: str = "",
        cap: int = 0,
    ) -> Lease:
        """Wait until every lock of `plan` is granted to `owner`, all at once.

        `flow` (the agent) places the waiter in the fair order; `cap` (0: none) is
        how many grants its flow may hold at once, this one included.

        Raises:
            Abandoned: `cancel` was set before the grant; nothing is held or queued.
            BackendClosed: the manager was closed.
        """
        if self._closed:
            raise BackendClosed("the lock manager is closed")
        if cancel is not None and cancel.is_set():
            raise Abandoned(owner)
        # Our own copy: the caller's mapping could change under the table.
        ask = Ask(entries(plan), flow, cap)
        queue = self._queue
        tag = self._turns.next_tag(flow, queue[0].rank[0] if queue else 0)
        if under_cap(ask, self._running) and admissible(ask.items, self._held, self._ahead(tag)):
            return self._grant(owner, plan, ask)
        waiter = _Waiter(owner, plan, ask, (tag, next(self._arrivals)))
        return await self._wait(waiter, cancel, on_wait)

    def snapshot(self) -> Snapshot:
        """Holders (grant order) and waiters (fair order), for debugging and explain."""
        holders = tuple(_entry(lease.owner, ask, True) for lease, ask in self._holders.items())
        waiters = tuple(_entry(w.owner, w.ask, False) for w in self._queue)
        return Snapshot(holders, waiters)

    def close(self) -> None:
        """Refuse new calls and fail every waiter with BackendClosed; leases stay valid."""
        self._closed = True
        queue, self._queue, self._waiting, self._turns = self._queue, [], LockTable(), Turns()
        for waiter in queue:
            waiter.future.set_exception(BackendClosed("the lock manager is closed"))

    # -- internals ---------------------------------------------------------------------

    def _ahead(self, tag: int) -> LockTable:
        """The plans of the waiters a new waiter with `tag` would stand behind."""
        queue = self._queue
        if not queue or tag >= queue[-1].rank[0]:
            return self._waiting  # behind everyone: the common case, at no cost
        return LockTable(w.ask.items for w in self._before(tag))

    def _before(self, tag: int) -> list[_Waiter]:
        """The waiters ahead of a new one with `tag` (equal tags arrived earlier)."""
        return self._queue[: bisect.bisect_right(self._queue, tag, key=lambda w: w.rank[0])]

    def _grant(self, owner: str, plan: Mapping[Key, LockMode], ask: Ask) -> Lease:
        self._held.add(ask.items)
        self._running[ask.flow] = self._running.get(ask.flow, 0) + 1
        lease = Lease(owner, plan, self._release)
        self._holders[lease] = ask
        return lease

    async def _wait(
        self,
        waiter: _Waiter,
        cancel: asyncio.Event | None,
        on_wait: Callable[[WaitInfo], None] | None,
    ) -> Lease:
        info = None
        if on_wait is not None:  # before joining: the waiters ahead of it only
            info = self._why(waiter)
        self._enqueue(waiter)
        try:
            if on_wait is not None and info is not None:
                on_wait(info)
            await _granted_or_cancelled(waiter.future, cancel)
        except BaseException:
            self._withdraw(waiter)
            raise
        if not waiter.future.done():  # the cancel event fired first
            self._withdraw(waiter)
            raise Abandoned(waiter.owner)
        return waiter.future.result()

    def _why(self, waiter: _Waiter) -> WaitInfo:
        holders = ((lease.owner, ask.items) for lease, ask in self._holders.items())
        ahead = ((w.owner, w.ask.items) for w in self._before(waiter.rank[0]))
        info = wait_info(waiter.ask.items, holders, ahead)
        if under_cap(waiter.ask, self._running):
            return info
        return WaitInfo(info.keys, info.blockers, capped=waiter.ask.cap)

    def _enqueue(self, waiter: _Waiter) -> None:
        bisect.insort(self._queue, waiter, key=lambda w: w.rank)
        self._waiting.add(waiter.ask.items)
        self._turns.join(waiter.ask.flow, waiter.rank[0])

    def _dequeue(self, gone: Iterable[_Waiter]) -> None:
        gone = set(gone)
        self._queue = [w for w in self._queue if w not in gone]
        for waiter in gone:
            self._waiting.remove(waiter.ask.items)
            self._turns.leave(waiter.ask.flow)

    def _withdraw(self, waiter: _Waiter) -> None:
        """Take a waiter that gives up out of the queue, or give back what it just got."""
        future = waiter.future
        if future.done():
            if not future.cancelled() and future.exception() is None:
                future.result().release()  # granted as it gave up: never leak it
            return
        future.cancel()
        self._dequeue((waiter,))
        if self._waiting.conflicts(waiter.ask.items):
            self._pump()  # whoever waited only behind it may go now

    def _release(self, lease: Lease) -> None:
        ask = self._holders.pop(lease)
        self._held.remove(ask.items)
        left = self._running[ask.flow] - 1
        if left:
            self._running[ask.flow] = left
        else:
            del self._running[ask.flow]
        # Only a waiter that conflicted with this plan, or one of its flow (it may have
        # waited for the cap), can have become grantable: otherwise the pass, which
        # reads the whole queue, is skipped (a quick call beside thousands of waiting
        # ones would pay for each of them at its release).
        if self._waiting.conflicts(ask.items) or self._turns.waiting(ask.flow):
            self._pump()

    def _pump(self) -> None:
        """Grant every waiter the rule admits now (`decide` adds them to `_held`)."""
        granted = decide(self._held, self._running, ((w, w.ask) for w in self._queue))
        if not granted:
            return
        self._dequeue(granted)
        for waiter in granted:
            lease = Lease(waiter.owner, waiter.plan, self._release)
            self._holders[lease] = waiter.ask
            waiter.future.set_result(lease)


async def _granted_or_cancelled(future: asyncio.Future[Any], cancel: asyncio.Event | None) -> None:
    """Return when `future` is done or `cancel` is set, whichever comes first.

    `asyncio.wait` never cancels the future it watches, so only the manager
    completes it (the queue invariant); a cancellation of the awaiting task
    surfaces here as CancelledError and the caller withdraws.
    """
    if cancel is None:
        await asyncio.wait((future,))
        return
    gave_up = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait((future, gave_up), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gave_up.cancel()


def _entry(owner: str, ask: Ask, granted: bool) -> LockEntry:
    plan = tuple((Key(parts), mode) for parts, mode in ask.items)
    return LockEntry(owner, plan, granted, flow=ask.flow, cap=ask.cap)


def explain(
    plans: Sequence[tuple[str, Mapping[Key, LockMode]]],
) -> list[tuple[str, tuple[str, ...]]]:
    """For a batch in proposal order on an empty table: whom each call waits for.

    Only direct conflicts are listed: a call waits for every earlier call whose
    plan conflicts with its own, whether that one holds or still waits.
    """
    out = []
    for i, (owner, plan) in enumerate(plans):
        blockers: dict[str, None] = {}
        for other, earlier in plans[:i]:
            if plans_conflict(plan, earlier):
                blockers[other] = None
        out.append((owner, tuple(blockers)))
    return out
