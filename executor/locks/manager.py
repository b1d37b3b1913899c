"""The in-process lock manager: one daemon, many concurrent calls.

An uncontended `acquire` is a few dictionary lookups and returns without
creating a future or a task; only a call that has to wait gets a future (and,
when it can be cancelled, one helper task that waits on the cancel event).
Grants follow `decide`: all locks at once, FIFO per conflict.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from .base import Abandoned, BackendClosed, Lease, LockEntry, Snapshot, WaitInfo
from .decide import Entries, LockTable, admissible, decide, entries, wait_info
from .keys import Key
from .modes import LockMode, plans_conflict


class _Waiter:
    __slots__ = ("future", "items", "owner", "plan")

    def __init__(self, owner: str, plan: Mapping[Key, LockMode], items: Entries) -> None:
        self.owner = owner
        self.plan = plan
        self.items = items
        # Invariant: pending while the waiter is in the queue; only the manager
        # completes it (result: the Lease; exception: BackendClosed).
        self.future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()


class LockManager:
    """Multi-granularity locks for the calls of one daemon (the default backend).

    Use it from the event loop's thread only: `Lease.release` wakes waiters
    through their futures.
    """

    def __init__(self) -> None:
        # Invariant: `_held` is exactly the union of the entries of `_holders`.
        self._held = LockTable()
        self._holders: dict[Lease, Entries] = {}
        # Invariant: `_waiting` is exactly the union of the entries of `_queue`
        # (FIFO order), and after every change no queued waiter is admissible:
        # grants are made as soon as they are possible.
        self._waiting = LockTable()
        self._queue: dict[_Waiter, None] = {}
        self._closed = False

    async def acquire(
        self,
        owner: str,
        plan: Mapping[Key, LockMode],
        *,
        cancel: asyncio.Event | None = None,
        on_wait: Callable[[WaitInfo], None] | None = None,
    ) -> Lease:
        """Wait until every lock of `plan` is granted to `owner`, all at once.

        Raises:
            Abandoned: `cancel` was set before the grant; nothing is held or queued.
            BackendClosed: the manager was closed.
        """
        if self._closed:
            raise BackendClosed("the lock manager is closed")
        if cancel is not None and cancel.is_set():
            raise Abandoned(owner)
        # Our own copy: the caller's mapping could change under the table.
        items = entries(plan)
        if admissible(items, self._held, self._waiting):
            self._held.add(items)
            lease = Lease(owner, plan, self._release)
            self._holders[lease] = items
            return lease
        return await self._wait(_Waiter(owner, plan, items), cancel, on_wait)

    def snapshot(self) -> Snapshot:
        """Holders (grant order) and waiters (FIFO order), for debugging and explain."""
        holders = tuple(_entry(lease.owner, items, True) for lease, items in self._holders.items())
        waiters = tuple(_entry(w.owner, w.items, False) for w in self._queue)
        return Snapshot(holders, waiters)

    def close(self) -> None:
        """Refuse new calls and fail every waiter with BackendClosed; leases stay valid."""
        self._closed = True
        queue, self._queue, self._waiting = self._queue, {}, LockTable()
        for waiter in queue:
            waiter.future.set_exception(BackendClosed("the lock manager is closed"))

    # -- internals ---------------------------------------------------------------------

    async def _wait(
        self,
        waiter: _Waiter,
        cancel: asyncio.Event | None,
        on_wait: Callable[[WaitInfo], None] | None,
    ) -> Lease:
        info = None
        if on_wait is not None:  # before joining: earlier waiters only
            holders = ((lease.owner, items) for lease, items in self._holders.items())
            info = wait_info(waiter.items, holders, ((w.owner, w.items) for w in self._queue))
        self._queue[waiter] = None
        self._waiting.add(waiter.items)
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

    def _withdraw(self, waiter: _Waiter) -> None:
        """Take a waiter that gives up out of the queue, or give back what it just got."""
        future = waiter.future
        if future.done():
            if not future.cancelled() and future.exception() is None:
                future.result().release()  # granted as it gave up: never leak it
            return
        future.cancel()
        del self._queue[waiter]
        self._waiting.remove(waiter.items)
        self._pump()  # whoever waited only behind it may go now

    def _release(self, lease: Lease) -> None:
        self._held.remove(self._holders.pop(lease))
        if self._queue:
            self._pump()

    def _pump(self) -> None:
        """Grant every waiter the rule admits now (`decide` adds them to `_held`)."""
        for waiter in decide(self._held, ((w, w.items) for w in self._queue)):
            del self._queue[waiter]
            self._waiting.remove(waiter.items)
            lease = Lease(waiter.owner, waiter.plan, self._release)
            self._holders[lease] = waiter.items
            waiter.future.set_result(lease)


async def _granted_or_cancelled(
    future: asyncio.Future[Lease], cancel: asyncio.Event | None
) -> None:
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


def _entry(owner: str, items: Entries, granted: bool) -> LockEntry:
    return LockEntry(owner, tuple((Key(parts), mode) for parts, mode in items), granted)


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
