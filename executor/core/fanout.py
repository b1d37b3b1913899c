"""Updates fanned out to watch streams, each watcher's backlog bounded.

A Watch stream (Approvals.Watch, Runs.WatchRun) sends updates as fast as its client
reads them. A client that stops reading (or reads slowly) lets updates pile up in
its queue, and each queued update keeps its data alive (a run event may carry a
megabyte). Each watcher may fall at most MAX_BACKLOG updates behind; past that its
queue is emptied and its stream ends with `Lagging` (the server answers
RESOURCE_EXHAUSTED): the client resubscribes (WatchRun from the last seq it saw).
Nothing is silently skipped: a watcher either gets every update in order or is told.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from .errors import ExecgateError

T = TypeVar("T")

# Updates a watcher may have queued and not yet sent; one more ends its stream.
MAX_BACKLOG = 1024


class Lagging(ExecgateError):
    """A watcher fell more than `backlog` updates behind; its stream ends. `resume` says
    how its client picks up again (WatchRun: from the last seq it was sent)."""

    def __init__(self, backlog: int, resume: str = "watch again") -> None:
        super().__init__(f"the watcher fell more than {backlog} updates behind; {resume}")
        self.backlog = backlog
        self.resume = resume


class Closed(ExecgateError):
    """The fan-out was closed (the daemon is stopping) while a watcher waited; `why` says
    why it was."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Watcher(Generic[T]):
    """One stream's queue; `get` returns the next update in order."""

    def __init__(self, backlog: int) -> None:
        self._queue: asyncio.Queue[T] = asyncio.Queue(backlog)
        # Set once, when an update did not fit or the fan-out closed: why the stream
        # ends (at once: what was queued is dropped).
        self._ended: ExecgateError | None = None
        self._wake = asyncio.Event()

    async def get(self) -> T:
        """The next update; raises Lagging or Closed once the stream must end."""
        while True:
            if self._ended is not None:
                raise self._ended
            if not self._queue.empty():
                return self._queue.get_nowait()
            self._wake.clear()
            await self._wake.wait()

    def offer(self, item: T) -> bool:
        """Queue `item`; False if it did not fit (the stream now ends with Lagging)."""
        if self._ended is not None:
            return True
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.end(Lagging(self._queue.maxsize))
            return False
        self._wake.set()
        return True

    def end(self, why: ExecgateError) -> None:
        self._ended = why
        while not self._queue.empty():  # drop the backlog now: it is never sent
            self._queue.get_nowait()
        self._wake.set()

    @property
    def backlog(self) -> int:
        return self._queue.qsize()


class Fanout(Generic[T]):
    """Every published update goes to every watcher, in order, each bounded."""

    def __init__(self, backlog: int = MAX_BACKLOG) -> None:
        self.backlog = backlog
        # Invariant: a watcher is here exactly while its stream is being served.
        self._watchers: set[Watcher[T]] = set()
        # Watchers ended because they lagged (for logs and tests).
        self.lagged = 0

    def subscribe(self) -> Watcher[T]:
        watcher: Watcher[T] = Watcher(self.backlog)
        self._watchers.add(watcher)
        return watcher

    def unsubscribe(self, watcher: Watcher[T]) -> None:
        self._watchers.discard(watcher)

    def publish(self, item: T) -> None:
        for watcher in list(self._watchers):
            if not watcher.offer(item):
                self.lagged += 1

    def close(self, why: str) -> None:
        for watcher in self._watchers:
            watcher.end(Closed(why))

    def __len__(self) -> int:
        return len(self._watchers)
