"""SqliteWriter: group commit, the inline fast path, cancelled submits, failed commits and
checkpoints, on real SQLite files."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from execgate.executor.journal.writer import SqliteWriter


def run_async(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(fn(), timeout=10))  # type: ignore[arg-type]


def _writer(path: Path) -> tuple[SqliteWriter, list[str]]:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    return SqliteWriter(conn), statements


def _count(path: Path) -> list[int]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT k FROM t ORDER BY k").fetchall()
    conn.close()
    return [r[0] for r in rows]


def _insert(k: int) -> Callable[[sqlite3.Connection], int]:
    def job(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t (k, v) VALUES (?, 'x')", (k,))
        return k

    return job


def test_writer_many_concurrent_submits_all_land(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    writer, _ = _writer(db)

    async def body() -> None:
        got = await asyncio.gather(
            *(writer.submit(_insert(k), durable=k % 7 == 0) for k in range(300))
        )
        assert got == list(range(300))

    try:
        run_async(body)
    finally:
        writer.close()
    assert _count(db) == list(range(300))


def test_writer_groups_queued_jobs_into_one_commit(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    writer, statements = _writer(db)
    started, go = threading.Event(), threading.Event()

    def blocker(conn: sqlite3.Connection) -> str:
        started.set()
        assert go.wait(10)
        return "blocker"

    async def body() -> None:
        first = asyncio.ensure_future(writer.submit(blocker, durable=True))
        assert await asyncio.to_thread(started.wait, 10)
        rest = [asyncio.ensure_future(writer.submit(_insert(k), durable=False)) for k in range(50)]
        await asyncio.sleep(0)  # every submit has queued its job
        go.set()
        assert await first == "blocker"
        assert await asyncio.gather(*rest) == list(range(50))
        # The blocker's transaction, then the 50 jobs that queued up while it was open:
        # one commit for them all, not 50.
        assert statements.count("COMMIT") == 2

    try:
        run_async(body)
    finally:
        writer.close()
    assert _count(db) == list(range(50))


def test_writer_fast_path_never_overtakes_a_pending_job(tmp_path: Path) -> None:
    """A non-durable write runs inline only when nothing is pending, so order holds."""
    db = tmp_path / "w.db"
    writer, _ = _writer(db)
    started, go = threading.Event(), threading.Event()
    seen: list[int] = []

    def blocker(conn: sqlite3.Connection) -> None:
        started.set()
        assert go.wait(10)

    def count(conn: sqlite3.Connection) -> int:
        return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])

    async def body() -> None:
        # Idle writer: the fast path commits on this thread, with no writer-thread hop.
        assert await writer.submit(_insert(1), durable=False) == 1
        ran_on = await writer.submit(lambda conn: threading.get_ident(), durable=False)
        assert ran_on == threading.get_ident()
        durable_on = await writer.submit(lambda conn: threading.get_ident(), durable=True)
        assert durable_on != threading.get_ident()  # fsyncing writes go to the writer
        first = asyncio.ensure_future(writer.submit(blocker, durable=True))
        assert await asyncio.to_thread(started.wait, 10)
        writer.submit_nowait(_insert(2), durable=False)  # queued behind the blocker
        later = asyncio.ensure_future(writer.submit(count, durable=False))
        await asyncio.sleep(0)
        assert not later.done()  # it waits: the fast path would have overtaken row 2
        go.set()
        await first
        seen.append(await later)

    try:
        run_async(body)
    finally:
        writer.close()
    assert seen == [2]
    assert _count(db) == [1, 2]


def test_writer_failing_job_rolls_back_alone(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    writer, statements = _writer(db)
    started, go = threading.Event(), threading.Event()

    def blocker(conn: sqlite3.Connection) -> None:
        started.set()
        assert go.wait(10)

    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t (k, v) VALUES (1000, 'partial')")
        raise ValueError("job failed")

    async def body() -> None:
        first = asyncio.ensure_future(writer.submit(blocker, durable=True))
        assert await asyncio.to_thread(started.wait, 10)
        jobs = [
            writer.submit(_insert(1), durable=True),
            writer.submit(half_then_fail, durable=True),
            writer.submit(_insert(1), durable=False),  # duplicate key: IntegrityError
            writer.submit(_insert(2), durable=False),
        ]
        futures = [asyncio.ensure_future(j) for j in jobs]
        await asyncio.sleep(0)
        go.set()
        await first
        got = await asyncio.gather(*futures, return_exceptions=True)
        assert got[0] == 1
        assert got[3] == 2
        assert isinstance(got[1], ValueError)
        assert isinstance(got[2], sqlite3.IntegrityError)
        assert statements.count("COMMIT") == 2  # the blocker's, then one for the group
        assert "PRAGMA synchronous=FULL" in statements  # a durable job was in it

    try:
        run_async(body)
    finally:
        writer.close()
    assert _count(db) == [1, 2]


def test_writer_submit_sync(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    writer, _ = _writer(db)
    try:
        assert writer.submit_sync(_insert(5), durable=True) == 5
        with pytest.raises(sqlite3.IntegrityError):
            writer.submit_sync(_insert(5), durable=True)
    finally:
        writer.close()
    assert _count(db) == [5]


def test_writer_survives_a_cancelled_submit(tmp_path: Path) -> None:
    """A caller that stops waiting (its task is cancelled) must not break the writer."""
    db = tmp_path / "w.db"
    writer, _ = _writer(db)
    started, go = threading.Event(), threading.Event()

    def blocker(conn: sqlite3.Connection) -> None:
        started.set()
        assert go.wait(10)

    async def body() -> None:
        first = asyncio.ensure_future(writer.submit(blocker, durable=True))
        assert await asyncio.to_thread(started.wait, 10)
        victim = asyncio.ensure_future(writer.submit(_insert(7), durable=False))
        bystander = asyncio.ensure_future(writer.submit(_insert(6), durable=False))
        await asyncio.sleep(0)  # both jobs are queued behind the blocker
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
        go.set()
        await first
        assert await asyncio.wait_for(bystander, 10) == 6
        assert await asyncio.wait_for(writer.submit(_insert(8), durable=False), 10) == 8

    try:
        run_async(body)
    finally:
        writer.close()
    assert _count(db) == [6, 8]  # the cancelled job was not written behind its caller's back


def test_writer_checkpoints_on_its_own_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Autocheckpoint is off; the writer thread checkpoints every CHECKPOINT_EVERY commits."""
    import execgate.executor.journal.writer as sw

    monkeypatch.setattr(sw, "CHECKPOINT_EVERY", 10)
    db = tmp_path / "w.db"
    writer, statements = _writer(db)

    async def body() -> None:
        for k in range(35):
            await writer.submit(_insert(k), durable=False)

    try:
        run_async(body)
    finally:
        writer.close()
    checkpoints = [s for s in statements if "wal_checkpoint(PASSIVE)" in s]
    assert len(checkpoints) == 3  # after commits 10, 20 and 30 (1-in-10 via the thread)
    assert "PRAGMA wal_autocheckpoint=0" in statements
    assert _count(db) == list(range(35))


# ---------------------------------------------------------------------------------------
# BUG 5: SqliteWriter._inline does not roll back when COMMIT itself fails: the shared
# connection stays inside the transaction and every later write fails ("cannot start a
# transaction within a transaction"). The writer-thread path (_commit) handles it.


def _fk_writer(tmp_path: Path) -> SqliteWriter:
    conn = sqlite3.connect(tmp_path / "w.db", isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("CREATE TABLE p (id INTEGER PRIMARY KEY)")
    conn.execute(
        "CREATE TABLE c (id INTEGER PRIMARY KEY, "
        "pid INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)"
    )
    return SqliteWriter(conn)


def _bad_child(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO c (pid) VALUES (42)")  # fails only at COMMIT


def _good_parent(conn: sqlite3.Connection) -> int:
    return int(conn.execute("INSERT INTO p DEFAULT VALUES").lastrowid or 0)


def test_writer_inline_commit_failure_leaves_connection_usable(tmp_path: Path) -> None:
    writer = _fk_writer(tmp_path)

    async def body() -> Any:
        with pytest.raises(sqlite3.IntegrityError):
            await writer.submit(_bad_child, durable=False)  # fast path
        return await writer.submit(_good_parent, durable=False)

    try:
        assert asyncio.run(body()) == 1
    finally:
        writer.close()


def test_writer_thread_commit_failure_leaves_connection_usable(tmp_path: Path) -> None:
    """Pinned (correct): the same failure on the writer thread is rolled back."""
    writer = _fk_writer(tmp_path)

    async def body() -> Any:
        with pytest.raises(sqlite3.IntegrityError):
            await writer.submit(_bad_child, durable=True)  # writer thread
        return await writer.submit(_good_parent, durable=True)

    try:
        assert asyncio.run(body()) == 1
    finally:
        writer.close()
