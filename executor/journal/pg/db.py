"""The PostgreSQL journal's database: psycopg 3's async connection pool, on a loop of
its own.

Why a thread with its own event loop: the store interfaces (journal/base.py) have
async methods, called on the daemon's loop, and blocking ones, called at startup and
from the span processor's thread. One loop owns the pool and everything that talks
to the server (the stores' transactions, the presence heartbeat, the LISTEN
connection); callers hand it a job and wait (`await` on the daemon's loop, or block
on another thread). The daemon's loop never waits for the network, as with the
SQLite writer thread.

Durability: a durable job commits with the server's `synchronous_commit` (on: the
commit is flushed to the server's disk before it returns); any other commits with
`synchronous_commit = off`, which survives a crash of the daemon (the commit is in
the server) but not of the server's machine -- the rule the SQLite journal keeps.

A connection lost (the server restarting, a network failure) is retried with
backoff for `retry_for` seconds, then `PgUnavailable` is raised. A job may run
again after its first commit landed unseen (the connection died inside COMMIT), so
every job is written to recognise its own earlier attempt (see calls.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from execgate.executor.core.errors import ExecgateError

from .schema import migrate

log = logging.getLogger("execgate.journal")

T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]
Job = Callable[[Conn], Awaitable[T]]


# True while a job runs again after a connection failure: its earlier attempt may have
# committed unseen, so a row that looks like its own is its own (calls.py, runs.py).
_RETRY: ContextVar[bool] = ContextVar("execgate_pg_retry", default=False)


def retried() -> bool:
    """Is the running job a retry (its first attempt may have committed)?"""
    return _RETRY.get()


class PgUnavailable(ExecgateError):
    """The PostgreSQL server could not be reached for `waited` seconds (`why`)."""

    def __init__(self, waited: float, why: str) -> None:
        super().__init__(f"the PostgreSQL journal is unreachable (for {waited:.1f}s): {why}")
        self.waited = waited
        self.why = why


class PgDb:
    """A pool of connections to `url`, the schema migrated; `close` ends it."""

    def __init__(self, url: str, *, pool_size: int = 8, retry_for: float = 30.0) -> None:
        self.url = url
        self.retry_for = retry_for
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="journal-pg", daemon=True
        )
        self._thread.start()
        # Invariant: every task this db started on its loop and not yet finished.
        self._tasks: set[asyncio.Task[Any]] = set()
        # Invariant: every pool opened and not yet closed.
        self._pools: list[AsyncConnectionPool[Conn]] = []
        try:
            self.pool: AsyncConnectionPool[Conn] = self.call(self._open(url, pool_size, True))
            self.lazy: AsyncConnectionPool[Conn] = self.call(self._open(url, pool_size, False))
            for step in self.call(self._migrate()):
                log.info("journal: migrated to schema %d: %s", step.version, step.what)
        except BaseException:
            # Refused (a newer schema) or unreachable: the pools' workers end before
            # their loop does (left on a closed loop they are errors at exit).
            try:
                self.call(self._close())
            finally:
                self._stop_loop()
            raise

    async def _open(self, url: str, size: int, durable: bool) -> AsyncConnectionPool[Conn]:
        """A pool whose commits are durable (the server's `synchronous_commit`), or not
        waited for on disk (`off` for the whole session: no SET per transaction)."""
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=size,
            open=False,
            timeout=10.0,
            # Statements outside a transaction block commit on their own (reads need no
            # BEGIN and ROLLBACK round trips); writes open theirs (`transaction`).
            kwargs={"autocommit": True}
            if durable
            else {"autocommit": True, "options": "-c synchronous_commit=off"},
            # No check at checkout (a round trip per transaction): a connection the
            # server dropped fails its statement and the job is retried (`_retrying`).
            reconnect_timeout=self.retry_for,
            name="execgate-journal" if durable else "execgate-journal-lazy",
        )
        try:
            await pool.open(wait=True, timeout=10.0)
        except psycopg.OperationalError as exc:
            await pool.close()
            raise PgUnavailable(10.0, str(exc)) from exc
        self._pools.append(pool)
        return pool

    async def _migrate(self) -> list[Any]:
        async with self.pool.connection() as conn:
            return await migrate(conn)

    # -- running work on the db's loop ------------------------------------------------

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run `coro` on the db's loop; its future (from any thread)."""
        return asyncio.run_coroutine_threadsafe(self._owned(coro), self.loop)

    async def _owned(self, coro: Coroutine[Any, Any, T]) -> T:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            return await coro
        finally:
            self._tasks.discard(task)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the db's loop and block until it ends (never on that loop)."""
        return self.submit(coro).result()

    async def on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro`, run on the db's loop, from any other event loop."""
        return await asyncio.wrap_future(self.submit(coro))

    # -- transactions ----------------------------------------------------------------

    async def write(self, job: Job[T], *, durable: bool, atomic: bool = True) -> T:
        """Run `job` in a transaction and wait for its commit. Not `atomic`: each of its
        statements commits on its own (one round trip for a one-statement write)."""
        return await self.on_loop(self._retrying(job, durable, atomic))

    def write_nowait(
        self,
        job: Job[Any],
        *,
        durable: bool,
        atomic: bool = True,
        expected: tuple[type[BaseException], ...] = (),
    ) -> concurrent.futures.Future[Any]:
        """Run `job` as `write` does, without waiting; its future. A failure is logged (an
        `expected` one, a normal answer such as a taken call id, at DEBUG)."""
        future = self.submit(self._retrying(job, durable, atomic))
        future.add_done_callback(lambda f: _log_failure(f, expected))
        return future

    def write_sync(self, job: Job[T], *, durable: bool) -> T:
        """Run `job` in a transaction and block until it is committed."""
        return self.call(self.transaction(job, durable=durable))

    async def read(self, job: Job[T]) -> T:
        """Run `job`'s reads (each statement on its own: a job that needs one snapshot
        opens a transaction itself)."""
        return await self.on_loop(self._retrying(job, False, False))

    def read_now(self, job: Job[T]) -> T:
        return self.call(self._retrying(job, False, False))

    async def transaction(self, job: Job[T], *, durable: bool, pipelined: bool = False) -> T:
        """On the db's loop: `job` in one transaction, retried while the server is away.
        `pipelined`: in pipeline mode (statements sent without waiting for each result
        until one is read: BEGIN and the statements before the first read, and the last
        ones with COMMIT, each cost one round trip together)."""
        if not pipelined:
            return await self._retrying(job, durable, True)

        async def in_pipeline(conn: Conn) -> T:
            async with conn.pipeline(), conn.transaction():
                return await job(conn)

        return await self._retrying(in_pipeline, durable, False)

    async def _retrying(self, job: Job[T], durable: bool, atomic: bool) -> T:
        """`job` on a connection of the durable or the lazy pool, in a transaction if
        `atomic`; retried with backoff while the server is unreachable."""
        started = time.monotonic()
        delay = 0.05
        while True:
            try:
                async with (self.pool if durable else self.lazy).connection() as conn:
                    if not atomic:
                        return await job(conn)
                    async with conn.transaction():
                        return await job(conn)
            except psycopg.OperationalError as exc:
                waited = time.monotonic() - started
                if waited > self.retry_for:
                    raise PgUnavailable(waited, str(exc)) from exc
                log.warning("journal: PostgreSQL unreachable, retrying: %s", exc)
                _RETRY.set(True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    # -- the end -----------------------------------------------------------------------

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.call(self._close())
        finally:
            self._stop_loop()

    async def _close(self) -> None:
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        while self._pools:
            await self._pools.pop().close()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _log_failure(
    future: concurrent.futures.Future[Any], expected: tuple[type[BaseException], ...]
) -> None:
    if future.cancelled():
        return
    error = future.exception()
    if error is not None:
        level = logging.DEBUG if isinstance(error, expected) else logging.ERROR
        log.log(level, "journal write failed: %s", error)
