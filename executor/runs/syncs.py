"""When a write of a run's record reaches the disk, and the fsyncs started in the
background for it (RunStore's `Durability.SOON`: a loop step's end).

Every write of a run's record is committed before its await returns (a crash of the
daemon keeps it). `Durability` says when it is also on disk (a crash of the machine keeps
it). A SOON write's fsync runs in a task these `Syncs` own; the run's next write waits
for it (`settled`), so nothing more of the run is recorded before it is on disk.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("execgate.runs")


class Durability(enum.Enum):
    """When a committed write of a run's record is on disk."""

    # fsync'd before the await returns.
    NOW = "now"
    # fsync'd right after, in the background; the run's next write waits for it.
    SOON = "soon"
    # fsync'd by the next durable write: the journal syncs in commit order (journal/base).
    FOLLOWING = "following"


class Syncs:
    """The background fsyncs of runs' records, at most one per run."""

    def __init__(self, sync: Callable[[str], Awaitable[None]]) -> None:
        # Makes every write committed so far durable (RunRecordStore.sync).
        self._sync = sync
        # Invariant: a run id is here from a SOON write until its fsync succeeded (a
        # failed one stays until the run's next write raises it).
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, run_id: str) -> None:
        """Start the fsync of what the run's record holds now. Under the run's lock."""
        task = asyncio.create_task(self._run(run_id), name=f"sync {run_id}")
        self._tasks[run_id] = task

        def settled(done: asyncio.Task[None]) -> None:
            if self._tasks.get(run_id) is done and not done.cancelled():
                if done.exception() is None:
                    del self._tasks[run_id]
                else:  # kept: the run's next write raises it
                    log.error("journal: run %s not synced: %s", run_id, done.exception())

        task.add_done_callback(settled)

    async def _run(self, run_id: str) -> None:
        await self._sync(run_id)

    async def settled(self, run_id: str) -> None:
        """Wait for the run's background fsync, if one is running; raise its failure.
        Under the run's lock (nothing can start another meanwhile)."""
        pending = self._tasks.get(run_id)
        if pending is None:
            return
        try:
            # Shielded: a writer that goes away must not cancel the fsync (the journal
            # skips a write whose waiter was cancelled).
            await asyncio.shield(pending)
        finally:
            if pending.done() and self._tasks.get(run_id) is pending:
                del self._tasks[run_id]

    async def drain(self) -> None:
        """Wait for every fsync started (at shutdown, once no RPC is served)."""
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()

    def __len__(self) -> int:
        return len(self._tasks)
