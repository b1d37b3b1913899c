"""The daemon among others sharing its journal (PostgreSQL): what they record reaches
the calls, approvals and runs served here.

Each notice of the journal (`NoticeStore`) is handed to the room that acts on it:
the dispatcher (cancels reach the calls running here, decisions the calls parked
here, keyed calls' ends the retries waiting for them, adopted approvals are parked
here), the run registry (WatchRun streams, ended runs, owners). A lost lease stops
the daemon: another daemon settled its calls and freed its locks already. With a
journal only this daemon writes (SQLite) there are no notices and this does nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from execgate.executor.journal.base import NoticeStore
from execgate.executor.journal.records import Notice, NoticeKind
from execgate.executor.pipeline.dispatch import Dispatcher
from execgate.executor.runs.registry import RunStore

log = logging.getLogger("execgate.server")


class Cluster:
    """Subscribed to `notices` from construction until `close`."""

    def __init__(
        self,
        notices: NoticeStore,
        dispatcher: Dispatcher,
        runs: RunStore,
        on_lost: Callable[[], None],
    ) -> None:
        self._dispatcher = dispatcher
        self._runs = runs
        self._on_lost = on_lost
        # Invariant: every task here handles one notice and has not finished.
        self._tasks: set[asyncio.Task[None]] = set()
        self._unsubscribe = notices.subscribe(self._heard)

    def _heard(self, notice: Notice) -> None:
        match notice.kind:
            case NoticeKind.LEASE_LOST:
                log.error("this daemon lost its lease in the shared journal: stopping")
                self._on_lost()
            case NoticeKind.RUN:
                self._spawn(self._runs.heard(notice.key))
            case NoticeKind.RESYNC:
                self._spawn(self._runs.reread())
                self._spawn(self._dispatcher.heard(notice))
            case _:
                self._spawn(self._dispatcher.heard(notice))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a notice from another daemon could not be handled: %s", task.exception())

    async def close(self) -> None:
        self._unsubscribe()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
