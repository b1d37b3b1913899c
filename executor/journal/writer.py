"""One writer thread for the SQLite journal, with group commit.

All writes go through a single connection owned by one thread. Jobs that arrive
while a transaction is being written are committed together in the next one,
so 32 concurrent calls cost far fewer fsyncs than 32. In a group of several
jobs each runs inside its own SAVEPOINT: a failing job is rolled back alone and
its caller gets the error.

Durability is chosen per transaction: if any job in it is `durable`, the commit
runs with synchronous=FULL (fsync before COMMIT returns); otherwise NORMAL, which
survives a crash of the daemon (the WAL is in the OS) but not of the machine.

Results go back to asyncio callers through `loop.call_soon_threadsafe`, with no
intermediate concurrent.futures.Future: this sits on every call's path.

A write can also be started without waiting (`start`): its `Started` is waited for
from a worker thread (`wait`, woken by the writer thread directly, never through
the event loop) or awaited on the loop (`done`). A writing tool that stages its
effect invisibly uses it to overlap its own fsyncs with the intent's
(docs/architecture.md, "The durable write path").

Fast path: a write that needs no fsync, submitted while nothing else is queued or
being written, runs on the caller's thread at once (an uncontended WAL commit
without fsync takes tens of microseconds, less than the two thread hand-offs it
replaces). Order is preserved: the fast path is taken only when no earlier job
is pending.

Checkpoints: SQLite's automatic WAL checkpoint would run inside whichever commit
crosses the threshold -- on the event loop, for a fast-path commit, stalling
every RPC for milliseconds. It is turned off; every CHECKPOINT_EVERY commits the
next write is routed to the writer thread, which runs a PASSIVE checkpoint after
replying to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
MAX_GROUP = 512
CHECKPOINT_EVERY = 256
log = logging.getLogger("execgate.journal")

Reply = Callable[[Any, BaseException | None], None]


@dataclass(slots=True)
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    durable: bool
    # Called on the writer thread with (value, error); None for fire-and-forget jobs.
    reply: Reply | None
    # For asyncio callers: skip the job if the caller already gave up.
    waiter: asyncio.Future[Any] | None = None
    # Failures of a fire-and-forget job that are an expected answer (logged at DEBUG).
    expected: tuple[type[BaseException], ...] = ()

    def log_failure(self, error: BaseException) -> None:
        level = logging.DEBUG if isinstance(error, self.expected) else logging.ERROR
        log.log(level, "journal write failed: %s", error)


class SqliteWriter:
    def __init__(self, conn: sqlite3.Connection) -> None:
        # Invariant: only the writer thread touches `_conn` after __init__.
        self._conn = conn
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._sync = ""
        # Held by whoever is using `_conn`: the writer thread or a fast-path caller.
        self._conn_lock = threading.Lock()
        # Jobs queued or being written. Invariant: 0 means the queue is empty and the
        # writer is idle, so a fast-path write cannot overtake an earlier job.
        self._pending = 0
        self._pending_lock = threading.Lock()
        # Commits since the last checkpoint (approximate across threads: a hint).
        self._since_checkpoint = 0
        conn.execute("PRAGMA wal_autocheckpoint=0")
        self._thread = threading.Thread(target=self._loop, name="journal-writer", daemon=True)
        self._thread.start()

    async def submit(self, fn: Callable[[sqlite3.Connection], T], *, durable: bool) -> T:
        if not durable and self._try_inline():
            try:
                return self._inline(fn)
            finally:
                self._conn_lock.release()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()

        def reply(value: Any, error: BaseException | None) -> None:
            loop.call_soon_threadsafe(_settle, waiter, value, error)

        self._put(_Job(fn, durable, reply, waiter))
        return await waiter

    def submit_nowait(
        self,
        fn: Callable[[sqlite3.Connection], Any],
        *,
        durable: bool,
        expected: tuple[type[BaseException], ...] = (),
    ) -> None:
        """Write without waiting for the result; a failure is only logged (an
        `expected` one, a normal answer such as a taken call id, at DEBUG)."""
        job = _Job(fn, durable, None, expected=expected)
        if not durable and self._try_inline():
            try:
                self._inline(fn)
            except Exception as exc:
                job.log_failure(exc)
            finally:
                self._conn_lock.release()
            return
        self._put(job)

    def start(self, fn: Callable[[sqlite3.Connection], T], *, durable: bool) -> Started[T]:
        """Queue `fn` for the next group commit and return at once (event loop only)."""
        started: Started[T] = Started(asyncio.get_running_loop())
        self._put(_Job(fn, durable, started.reply))
        return started

    def submit_sync(self, fn: Callable[[sqlite3.Connection], T], *, durable: bool) -> T:
        done = threading.Event()
        box: list[Any] = []

        def reply(value: Any, error: BaseException | None) -> None:
            box[:] = [value, error]
            done.set()

        self._put(_Job(fn, durable, reply))
        done.wait()
        if box[1] is not None:
            raise box[1]
        return box[0]  # type: ignore[no-any-return]

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._conn.close()

    def _put(self, job: _Job) -> None:
        with self._pending_lock:
            self._pending += 1
        self._queue.put(job)

    def _try_inline(self) -> bool:
        """Take the connection for a fast-path write if nothing is pending."""
        if self._since_checkpoint >= CHECKPOINT_EVERY:
            return False  # let the writer thread take this one, and checkpoint after it
        if self._pending or not self._conn_lock.acquire(blocking=False):
            return False
        if self._pending:  # a job arrived between the check and the lock
            self._conn_lock.release()
            return False
        return True

    def _inline(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self._set_sync("NORMAL")
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            value = fn(self._conn)
            self._conn.execute("COMMIT")
        except BaseException:
            # Also when COMMIT itself failed: never leave the shared connection
            # inside a transaction, or every later write would fail.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        self._since_checkpoint += 1
        return value

    def _checkpoint(self) -> None:
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # a busy reader: try again after the next commits
            log.warning("journal checkpoint failed: %s", exc)
        self._since_checkpoint = 0

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
            with self._conn_lock:
                self._commit(group)
                self._since_checkpoint += 1
                with self._pending_lock:
                    self._pending -= len(group)
                if self._since_checkpoint >= CHECKPOINT_EVERY:
                    self._checkpoint()
            if stop:
                return

    def _commit(self, group: list[_Job]) -> None:
        # A job whose caller stopped waiting (cancelled) is skipped.
        group = [job for job in group if job.waiter is None or not job.waiter.cancelled()]
        if not group:
            return
        results: list[tuple[_Job, Any, BaseException | None]] = []
        try:
            self._set_sync("FULL" if any(j.durable for j in group) else "NORMAL")
            self._conn.execute("BEGIN IMMEDIATE")
            if len(group) == 1:  # alone: its failure rolls back the transaction below
                results.append((group[0], group[0].fn(self._conn), None))
            else:
                results.extend(self._run(job) for job in group)
            self._conn.execute("COMMIT")
        except BaseException as exc:  # the whole transaction failed: tell every caller
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            results = [(job, None, exc) for job in group]
        for job, value, error in results:
            if job.reply is None:
                if error is not None:
                    job.log_failure(error)
                continue
            try:
                job.reply(value, error)
            except RuntimeError as exc:  # the caller's loop is closed: nobody to tell
                log.error("journal reply lost: %s", exc)

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


class Started(Generic[T]):
    """A write queued by `SqliteWriter.start`: its result once committed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: asyncio.Future[T] = loop.create_future()
        self._committed = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def reply(self, value: Any, error: BaseException | None) -> None:
        """On the writer thread: wake a waiting worker thread first (it is the one
        on the critical path), then the event loop."""
        self._value, self._error = value, error
        self._committed.set()
        with contextlib.suppress(RuntimeError):  # a closed loop: only a thread can wait
            self._loop.call_soon_threadsafe(_settle, self._future, value, error)

    def wait(self) -> T:
        """Block until committed (a worker thread; never the event loop's)."""
        self._committed.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[no-any-return]

    async def done(self) -> T:
        """Await the commit on the event loop."""
        return await asyncio.shield(self._future)


def _settle(waiter: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if waiter.done():  # the caller was cancelled meanwhile
        return
    if error is None:
        waiter.set_result(value)
    else:
        waiter.set_exception(error)
