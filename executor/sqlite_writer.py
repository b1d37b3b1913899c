"""One writer thread for the SQLite journal, with group commit.

All writes go through a single connection owned by one thread. Jobs that arrive
while a transaction is being written are committed together in the next one,
so 32 concurrent calls cost far fewer fsyncs than 32. Each job runs inside its
own SAVEPOINT: a failing job is rolled back alone and its caller gets the error.

Durability is chosen per transaction: if any job in it is `durable`, the commit
runs with synchronous=FULL (fsync before COMMIT returns); otherwise NORMAL, which
survives a crash of the daemon (the WAL is in the OS) but not of the machine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
MAX_GROUP = 512


@dataclass(slots=True)
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    durable: bool
    future: concurrent.futures.Future[Any]


class SqliteWriter:
    def __init__(self, conn: sqlite3.Connection) -> None:
        # Invariant: only the writer thread touches `_conn` after start().
        self._conn = conn
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._sync = ""
        self._thread = threading.Thread(target=self._loop, name="journal-writer", daemon=True)
        self._thread.start()

    async def submit(self, fn: Callable[[sqlite3.Connection], T], *, durable: bool) -> T:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put(_Job(fn, durable, future))
        return await asyncio.wrap_future(future)

    def submit_sync(self, fn: Callable[[sqlite3.Connection], T], *, durable: bool) -> T:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put(_Job(fn, durable, future))
        return future.result()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._conn.close()

    def _loop(self) -> None:
        while (first := self._queue.get()) is not None:
            group = [first]
            stop = False
            while len(group) < MAX_GROUP:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                group.append(job)
            self._commit(group)
            if stop:
                return

    def _commit(self, group: list[_Job]) -> None:
        results: list[tuple[_Job, Any, BaseException | None]] = []
        try:
            self._set_sync("FULL" if any(j.durable for j in group) else "NORMAL")
            self._conn.execute("BEGIN IMMEDIATE")
            for job in group:
                results.append(self._run(job))
            self._conn.execute("COMMIT")
        except BaseException as exc:  # the whole transaction failed: tell every caller
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            for job in group:
                job.future.set_exception(exc)
            return
        for job, value, error in results:
            if error is None:
                job.future.set_result(value)
            else:
                job.future.set_exception(error)

    def _run(self, job: _Job) -> tuple[_Job, Any, BaseException | None]:
        self._conn.execute("SAVEPOINT job")
        try:
            value = job.fn(self._conn)
        except Exception as exc:
            self._conn.execute("ROLLBACK TO job")
            self._conn.execute("RELEASE job")
            return job, None, exc
        self._conn.execute("RELEASE job")
        return job, value, None

    def _set_sync(self, level: str) -> None:
        if level != self._sync:
            self._conn.execute(f"PRAGMA synchronous={level}")
            self._sync = level
