"""The SQLite journal's database: one writing connection behind the group-commit
writer (writer.py) and one reading connection per worker thread.

Every SQLite store of the journal (calls, approvals, runs, cancels, reloads, spans)
runs its SQL through one `SqliteDb`, so their writes share the writer's
transactions and its durability rule (a transaction with a durable job is fsync'd).
Nothing outside the journal room sees a connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .schema import migrate
from .writer import SqliteWriter, Started

log = logging.getLogger("execgate.journal")

T = TypeVar("T")

Job = Callable[[sqlite3.Connection], T]


class SqliteDb:
    """Opens (and migrates) the journal at `path`; `close` ends its writer."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        existed = self.path.exists()
        conn = connect(self.path)
        try:
            applied = migrate(conn)
        except BaseException:
            conn.close()
            raise
        for step in applied if existed else ():
            log.info("journal %s: migrated to schema %d: %s", self.path, step.version, step.what)
        self._writer = SqliteWriter(conn)
        self._local = threading.local()

    def close(self) -> None:
        self._writer.close()

    async def write(self, fn: Job[T], *, durable: bool) -> T:
        """Run `fn` in the writer's transaction (group commit) and wait for its commit."""
        return await self._writer.submit(fn, durable=durable)

    def write_nowait(
        self, fn: Job[Any], *, durable: bool, expected: tuple[type[BaseException], ...] = ()
    ) -> None:
        """Run `fn` in the writer's transaction without waiting; a failure is logged."""
        self._writer.submit_nowait(fn, durable=durable, expected=expected)

    def write_started(self, fn: Job[T], *, durable: bool) -> Started[T]:
        """Queue `fn` for the writer's next transaction and return at once; the result
        is waited for from a worker thread (`wait`) or awaited (`done`)."""
        return self._writer.start(fn, durable=durable)

    def write_sync(self, fn: Job[T], *, durable: bool) -> T:
        """Run `fn` in the writer's transaction and block until it is committed (at
        startup, or from threads other than the event loop's)."""
        return self._writer.submit_sync(fn, durable=durable)

    async def read(self, fn: Job[T]) -> T:
        """Run a read in a worker thread, on that thread's own connection."""
        return await asyncio.to_thread(lambda: fn(self._reader()))

    def read_now(self, fn: Job[T]) -> T:
        """Run a read on the calling thread (startup only)."""
        return fn(self._reader())

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path)
            self._local.conn = conn
        return conn


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn
