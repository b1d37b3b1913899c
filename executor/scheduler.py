"""When a call may run. (Interim: one workspace-wide read/write lock.)

Read-only calls share the workspace; a call that may write holds it alone.
Grants are FIFO: a reader queued behind a waiting writer waits for it, so a
writer never starves behind a stream of readers, and conflicting calls of one
batch run in the order the model proposed them. The resource-dependency
scheduler (per-file and per-table locks) replaces this behind the same
`acquire` interface.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from .tools import Mode


class Abandoned(Exception):
    """The waiter gave up (its batch was cancelled) before the lock was granted."""


@dataclass(eq=False, slots=True)
class _Waiter:
    mode: Mode
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class WorkspaceLock:
    def __init__(self) -> None:
        # Invariant: readers > 0 and writer are never both true.
        self._readers = 0
        self._writer = False
        self._queue: collections.deque[_Waiter] = collections.deque()

    @contextlib.asynccontextmanager
    async def acquire(
        self, mode: Mode, abandon: asyncio.Event | None = None
    ) -> AsyncIterator[None]:
        waiter = _Waiter(mode)
        self._queue.append(waiter)
        self._grant()
        try:
            await _wait_granted(waiter, abandon)
        except BaseException:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._release(mode)
            else:
                waiter.granted.cancel()
                self._queue.remove(waiter)
                self._grant()
            raise
        try:
            yield
        finally:
            self._release(mode)

    def _release(self, mode: Mode) -> None:
        if mode is Mode.WRITE:
            self._writer = False
        else:
            self._readers -= 1
        self._grant()

    def _grant(self) -> None:
        while self._queue:
            head = self._queue[0]
            if head.mode is Mode.WRITE:
                if self._writer or self._readers:
                    return
                self._writer = True
            else:
                if self._writer:
                    return
                self._readers += 1
            self._queue.popleft()
            head.granted.set_result(None)


async def _wait_granted(waiter: _Waiter, abandon: asyncio.Event | None) -> None:
    if waiter.granted.done():  # granted at once: the common case, no task needed
        return
    if abandon is None:
        await waiter.granted
        return
    gave_up = asyncio.ensure_future(abandon.wait())
    try:
        await asyncio.wait({waiter.granted, gave_up}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gave_up.cancel()
    if not waiter.granted.done():
        raise Abandoned
