"""The PostgreSQL lock backend: daemons sharing one lock table in the journal's database
keep the grant rule of the other backends (locks/decide.py), wake on NOTIFY, and a dead
daemon's entries go within its lease.

Each "daemon" here is a `PgJournal` (its own presence, lease and LISTEN session) with a
`PgLockManager`, on the session's throwaway server (tests/pg_support.py); the kill test
runs one in a child process (`python -m tests.integration.test_pg_locks hold URL`).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execgate.executor.journal.pg.store import PgJournal
from execgate.executor.locks import Abandoned, WaitInfo, path_key
from execgate.executor.locks.pg_backend import PgLockManager
from tests.daemon import scaled
from tests.integration.test_filelock_locks import ROOT, SHARED, R, W, run_async, until
from tests.pg_support import PgServer
from tests.unit.locks.test_locks import Run, calls

SPACE = "test-space"


@pytest.fixture
def url(pg_server: PgServer, request: pytest.FixtureRequest) -> str:
    name = "l" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    return pg_server.database(name)


@contextmanager
def daemon(url: str, lease: float = 3.0) -> Iterator[PgLockManager]:
    """One daemon's journal and lock manager on `url`."""
    journal = PgJournal(url, lease=lease)
    manager = PgLockManager(journal, SPACE)
    try:
        yield manager
    finally:
        manager.close()
        journal.close()


def test_conflicting_writes_wait_and_readers_share_across_daemons(url: str) -> None:
    async def body() -> None:
        with daemon(url) as a, daemon(url) as b:
            w1 = await a.acquire("a:w1", W(SHARED))
            infos: list[WaitInfo] = []
            w2 = asyncio.create_task(b.acquire("b:w2", W(SHARED), on_wait=infos.append))
            await until(lambda: bool(infos))
            assert infos == [WaitInfo((path_key(ROOT, SHARED),), ("a:w1",))]
            assert not w2.done()
            other = await asyncio.wait_for(b.acquire("b:other", W("other.txt")), 5)
            w1.release()
            lease2 = await asyncio.wait_for(w2, 5)  # woken by the release's NOTIFY
            lease2.release()
            other.release()
            r1 = await a.acquire("a:r", R(SHARED))
            r2 = await asyncio.wait_for(b.acquire("b:r", R(SHARED)), 5)  # readers together
            assert {e.owner for e in a.snapshot().holders} == {"a:r", "b:r"}
            r1.release()
            r2.release()
            await until(lambda: a.snapshot().holders == ())

    run_async(body)


def test_cancel_while_waiting_leaves_no_entry(url: str) -> None:
    async def body() -> None:
        with daemon(url) as a, daemon(url) as b:
            lease = await a.acquire("a:1", W(SHARED))
            cancel = asyncio.Event()
            waiter = asyncio.create_task(b.acquire("b:1", W(SHARED), cancel=cancel))
            await until(lambda: len(a.snapshot().waiters) == 1)
            cancel.set()
            with pytest.raises(Abandoned):
                await waiter
            await until(lambda: a.snapshot().waiters == ())
            task = asyncio.create_task(b.acquire("b:2", W(SHARED)))
            await until(lambda: len(a.snapshot().waiters) == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(lambda: a.snapshot().waiters == ())
            lease.release()
            await until(lambda: a.snapshot().holders == ())
            with pytest.raises(Abandoned):
                await b.acquire("b:3", W(SHARED), cancel=cancel)

    run_async(body)


def test_fifo_per_conflict_across_daemons(url: str) -> None:
    async def body() -> None:
        with daemon(url) as a, daemon(url) as b:
            r1 = await a.acquire("r1", R(SHARED))
            w2 = asyncio.create_task(b.acquire("w2", W(SHARED)))
            await until(lambda: len(a.snapshot().waiters) == 1)
            infos: list[WaitInfo] = []
            r3 = asyncio.create_task(a.acquire("r3", R(SHARED), on_wait=infos.append))
            free = await a.acquire("free", W("other.txt"))  # conflicts with nobody: at once
            await until(lambda: bool(infos))  # told once its entry is in the table
            assert infos == [WaitInfo((path_key(ROOT, SHARED),), ("w2",))]
            assert [e.owner for e in b.snapshot().waiters] == ["w2", "r3"]
            r1.release()
            lease2 = await asyncio.wait_for(w2, 5)
            assert not r3.done()
            lease2.release()
            (await asyncio.wait_for(r3, 5)).release()
            free.release()
            await until(lambda: a.snapshot().holders == ())

    run_async(body)


def test_fair_order_and_caps_across_daemons(url: str) -> None:
    """As with filelock: a flow is one agent of one daemon, in decide.Turns order; a cap
    counts one daemon's grants."""

    async def body() -> None:
        with daemon(url) as a, daemon(url) as b:
            first = await a.acquire("a0", W("."), flow="x")
            # One at a time: two acquires started together reach the table on two of
            # the pool's connections, in either order (the order of arrival is not
            # what this test is about).
            flood = [await queued(a, f"a{i}", n) for n, i in enumerate((1, 2), 1)]
            more = [await queued(a, f"a{i}", n) for n, i in enumerate((3, 4), 3)]
            quick = asyncio.create_task(b.acquire("b0", R(SHARED), flow="y"))
            await until(lambda: len(a.snapshot().waiters) == 5)
            assert [e.owner for e in b.snapshot().waiters] == ["a1", "a2", "b0", "a3", "a4"]
            first.release()
            for task in (*flood, quick, *more):
                (await asyncio.wait_for(task, 5)).release()
            infos: list[WaitInfo] = []
            one = await a.acquire("p", R("p"), flow="x", cap=1)
            capped = asyncio.create_task(
                a.acquire("q", R("q"), flow="x", cap=1, on_wait=infos.append)
            )
            other = await asyncio.wait_for(b.acquire("r", R("r"), flow="x", cap=1), 5)
            await until(lambda: bool(infos))
            assert infos == [WaitInfo((), (), capped=1)]
            assert not capped.done()
            one.release()
            (await asyncio.wait_for(capped, 5)).release()
            other.release()
            await until(lambda: a.snapshot().holders == a.snapshot().waiters == ())

    run_async(body)


async def queued(manager: PgLockManager, owner: str, waiting: int) -> asyncio.Task[Any]:
    """An exclusive acquire of the workspace by agent x, once it is the `waiting`th waiter."""
    task = asyncio.create_task(manager.acquire(owner, W("."), flow="x"))
    await until(lambda: len(manager.snapshot().waiters) == waiting)
    return task


def test_a_killed_daemons_locks_go_within_its_lease(url: str) -> None:
    lease = 2.0
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.test_pg_locks", "hold", url, str(lease)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"

        async def body() -> None:
            with daemon(url, lease=lease) as mine:
                infos: list[WaitInfo] = []
                waiter = asyncio.create_task(mine.acquire("w", W(SHARED), on_wait=infos.append))
                await until(lambda: bool(infos))
                assert infos[0].blockers == ("dead:hold",)
                holder.send_signal(signal.SIGKILL)
                holder.wait()
                killed = time.monotonic()
                # Its session is gone: the next heartbeat reaps it (a third of the lease).
                (await asyncio.wait_for(waiter, scaled(lease + 2))).release()
                assert time.monotonic() - killed <= scaled(lease)
                await until(lambda: mine.snapshot().holders == ())

        run_async(body)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=calls(), seed=st.integers(0, 2**32 - 1))
def test_random_schedules_keep_the_rule_across_daemons(
    pg_server: PgServer, specs: list[Any], seed: int
) -> None:
    url = pg_server.database(f"random{seed % 7}")

    async def body() -> None:
        with daemon(url) as a, daemon(url) as b:
            run = Run([a, b], specs, random.Random(seed))
            await run.drive()
            await until(lambda: a.snapshot().holders == a.snapshot().waiters == ())

    run_async(body, timeout=60)


def _hold(url: str, lease: float) -> None:
    """A daemon that takes the shared file's write lock, says so, and waits to be killed."""

    async def body() -> None:
        journal = PgJournal(url, lease=lease)
        manager = PgLockManager(journal, SPACE)
        await manager.acquire("dead:hold", W(SHARED))
        print("held", flush=True)
        await asyncio.Event().wait()

    asyncio.run(body())


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        _hold(sys.argv[2], float(sys.argv[3]))


def test_a_daemon_that_lost_its_lease_cannot_commit_as_the_holder(url: str) -> None:
    """Its lease runs out (here: set to the past, as a hung or cut-off daemon's would): the
    other daemon reaps it -- its running call settled, its lock entries gone -- and the
    lost daemon may no longer record an intent under the locks it was granted, learns it
    lost its lease, and its waiters fail."""
    from execgate.executor.core.outcomes import Outcome, Status
    from execgate.executor.journal.pg.presence import LeaseLost
    from execgate.executor.journal.records import CallRecord, DuplicateCall
    from execgate.executor.locks import LockError
    from tests.pg_support import pg_execute, pg_rows

    def rec(call_id: str) -> CallRecord:
        return CallRecord(
            run_id="r",
            call_id=call_id,
            batch_id="b",
            tool="write_file",
            arguments_json="{}",
            request_hash="h",
            idempotency_key="",
            agent="bot",
            may_write=True,
            created_at=time.time(),
        )

    async def body() -> None:
        lost_journal = PgJournal(url, lease=60.0)
        lost = PgLockManager(lost_journal, SPACE)
        told: list[bool] = []
        lost_journal.presence.on_lost.append(lambda: told.append(True))
        try:
            with daemon(url, lease=60.0) as other:
                held = await lost.acquire("lost:w", W(SHARED))
                await lost_journal.record_intent(rec("running"))
                waiting = asyncio.create_task(lost.acquire("lost:later", W(SHARED)))
                theirs = asyncio.create_task(other.acquire("other:w", W(SHARED)))
                await until(lambda: len(other.snapshot().waiters) == 2)
                me = lost_journal.presence.daemon_id
                expire = "UPDATE daemons SET lease_until = now() - interval '1 s' WHERE id = ?"
                assert pg_execute(url, expire, (me,)) == 1
                # The other daemon's heartbeat (a third of its lease) is too slow for a
                # test: it reaps now, as its heartbeat would.
                reaper = PgJournal(url, lease=60.0)
                try:
                    assert reaper.presence.reap_now() == 1
                finally:
                    reaper.close()
                (await asyncio.wait_for(theirs, 10)).release()
                with pytest.raises(LeaseLost):
                    await lost_journal.record_intent(rec("fenced"))
                with pytest.raises(DuplicateCall):  # settled by the reaper: not ours
                    await lost_journal.record_outcome(
                        "r", "running", Outcome(status=Status.SUCCESS), "", durable=True
                    )
                await until(lambda: bool(told), limit=30)  # its own heartbeat found out
                with pytest.raises(LockError):
                    await asyncio.wait_for(waiting, 10)
                held.release()
                settled = pg_rows(url, "SELECT status FROM calls WHERE call_id = 'running'")
                assert settled == [("unknown_outcome",)]
                assert pg_rows(url, "SELECT count(*) FROM calls WHERE call_id = 'fenced'") == [(0,)]
        finally:
            lost.close()
            lost_journal.close()

    run_async(body, timeout=60)
