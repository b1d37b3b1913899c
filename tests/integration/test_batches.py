"""Regression tests from a review of the scheduler integration: each reproduced a bug
(since fixed: batch order across early exits, duplicate ids under async validation,
disconnect scope, retry of a running call, idempotency confirmation, inline COMMIT
failure) or pins a subtle behaviour that was checked and found correct."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from execgate.client import Call, Client, EventKind, Status
from execgate.client import wire as cwire
from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Outcome
from execgate.executor.core.outcomes import Status as DStatus
from execgate.executor.journal.store import CallRecord
from execgate.executor.journal.writer import SqliteWriter
from execgate.executor.pipeline.idempotency import Idempotency
from execgate.v1 import executor_pb2_grpc as pb_grpc
from tests.daemon import Daemon
from tests.support import Streamer, wait_until


def _run() -> str:
    return "rev-" + uuid.uuid4().hex[:10]


def _work(path: str, *, write: bool, seconds: float, call_id: str, key: str = "") -> Call:
    return Call(
        tool="work",
        arguments={"path": path, "write": write, "seconds": seconds},
        call_id=call_id,
        idempotency_key=key,
    )


# ---------------------------------------------------------------------------------------
# BUG 1: a call that ends before its turn (validation rejected, duplicate id) passes its
# turn at once, so the next call reaches the lock queue before earlier calls of the batch.


def test_rejected_call_lets_later_conflicting_call_overtake(client: Client) -> None:
    """c0 (`work`, analysed in a worker thread) and c2 (`write_file`, analysed inline) both
    write f.txt; c1 is rejected (unknown tool). Conflicting calls of a batch must start in
    proposal order, so c2 must wait for c0. Today c1 sets turns[1] immediately and c2
    takes the lock on f.txt before c0 has even asked for it."""
    run = _run()
    events = list(
        client.stream(
            [
                _work("f.txt", write=True, seconds=0.3, call_id="c0"),
                Call(tool="no_such_tool", arguments={}, call_id="c1"),
                Call(tool="write_file", arguments={"path": "f.txt", "content": "x"}, call_id="c2"),
            ],
            run_id=run,
        )
    )
    started = [e.call_id for e in events if e.kind is EventKind.STARTED]
    waiting = {e.call_id: e.blocked_by for e in events if e.kind is EventKind.WAITING}
    assert started == ["c0", "c2"], (started, waiting)
    assert "c0" not in waiting, waiting


def test_duplicate_call_id_in_batch_refuses_the_later_call(client: Client) -> None:
    """Two calls of a batch share id "c0". The later one (index 1) must be the one refused.
    Today the earlier `work` call is still validating in a worker thread when the noop
    (validated inline) registers (run, "c0") in Dispatcher._active, so the *first* proposed
    call is refused as the duplicate and the later one runs (dispatch.py:186)."""
    run = _run()
    events = list(
        client.stream(
            [
                _work("g.txt", write=True, seconds=0.1, call_id="c0"),
                Call(tool="noop", arguments={}, call_id="c0"),
            ],
            run_id=run,
        )
    )
    by_index = {e.index: e.outcome for e in events if e.kind is EventKind.FINISHED}
    assert by_index[1] is not None
    assert by_index[1].error_class == "duplicate_call_id"
    assert by_index[0] is not None
    assert by_index[0].status is Status.SUCCESS, (by_index[0].status, by_index[0].error_class)


# ---------------------------------------------------------------------------------------
# BUG 2: _abandon finds calls by (run_id, call_id) only, so a disconnecting batch cancels
# a *different* batch's queued call that happens to share a call id with one of its own.


def test_abandon_cancels_other_batchs_queued_call_with_same_id(daemon: Daemon) -> None:
    run = _run()
    # Batch A: a1 holds f.txt for a while, "x" queues behind it.
    a = Streamer(
        daemon.address,
        [
            _work("f.txt", write=True, seconds=1.5, call_id="a1"),
            Call(tool="write_file", arguments={"path": "f.txt", "content": "A"}, call_id="x"),
        ],
        run_id=run,
    )
    wait_until(lambda: a.seen(EventKind.WAITING, "x"), "x waiting")
    # Batch B (another connection): a long call, plus its own "x" (refused as duplicate).
    channel = grpc.insecure_channel(daemon.address)
    stub = pb_grpc.ExecutorStub(channel)
    req = cwire.execute_request(
        [
            _work("other.txt", write=True, seconds=3, call_id="b1"),
            Call(tool="noop", arguments={}, call_id="x"),
        ],
        run,
        "",
        False,
    )
    stream = stub.Execute(req)
    kinds = []
    for msg in stream:
        kinds.append((msg.call_id, msg.WhichOneof("kind")))
        if ("b1", "started") in kinds and ("x", "finished") in kinds:
            break
    stream.cancel()  # B disconnects: only B's queued calls may be cancelled
    channel.close()
    a.join(20)
    out = a.outcome("x")
    assert out.status is Status.SUCCESS, (out.status, out.error_class, out.message)


# ---------------------------------------------------------------------------------------
# BUG 3 (consistency): a client retrying its batch (same call id, same idempotency key)
# while the original is still running gets REJECTED/duplicate_call_id instead of joining
# it, though the docs say retry with the same key is how a disconnected client recovers.


def test_retry_of_running_call_with_same_id_and_key_joins(client: Client, daemon: Daemon) -> None:
    run = _run()
    call = _work("r.txt", write=True, seconds=1.0, call_id="r1", key="k-" + run)
    first = Streamer(daemon.address, [call], run_id=run)
    wait_until(lambda: first.seen(EventKind.STARTED, "r1"), "r1 started")
    retry = client.execute([call], run_id=run)[0]
    first.join(20)
    original = first.outcome("r1")
    assert original.status is Status.SUCCESS
    assert retry.status is Status.SUCCESS, (retry.status, retry.error_class, retry.message)


def test_retry_of_finished_call_with_same_id_and_key_is_replayed(client: Client) -> None:
    """Pinned (correct): the very same call resent after it finished is answered from
    the journal, with replay_of naming itself, and does not run again."""
    run = _run()
    call = _work("s.txt", write=True, seconds=0, call_id="s1", key="k-" + run)
    first = client.execute([call], run_id=run)[0]
    again = client.execute([call], run_id=run)[0]
    assert first.status is Status.SUCCESS
    assert again.status is Status.SUCCESS
    assert again.replay_of == "s1"
    assert again.text == first.text  # the counter read the same value: it ran once


# ---------------------------------------------------------------------------------------
# BUG 4: idempotency.claim: while the owner reads the journal, a retry whose request
# matches the *recorded* call is checked against the in-flight owner's hash instead and
# is REJECTED as a conflict (a legitimate replay refused).


class _SlowJournal:
    def __init__(self, recorded: CallRecord) -> None:
        self.recorded = recorded
        self.go = asyncio.Event()

    async def by_idempotency_key(self, agent: str, key: str) -> CallRecord | None:
        await self.go.wait()
        return self.recorded


def test_idempotency_replay_refused_while_conflicting_owner_reads_journal() -> None:
    recorded = CallRecord(
        run_id="r",
        call_id="orig",
        batch_id="b",
        tool="noop",
        arguments_json="{}",
        request_hash="H0",
        idempotency_key="K",
        agent="a",
        may_write=False,
        created_at=0.0,
        outcome=Outcome(status=DStatus.SUCCESS),
    )

    async def body() -> tuple[Any, Any]:
        journal = _SlowJournal(recorded)
        idem = Idempotency(journal)  # type: ignore[arg-type]
        wrong = asyncio.ensure_future(idem.claim("a", "K", "H1", "r", "c1"))  # a different request
        await asyncio.sleep(0)
        right = asyncio.ensure_future(idem.claim("a", "K", "H0", "r", "c2"))  # a true retry
        await asyncio.sleep(0)
        journal.go.set()
        return tuple(await asyncio.gather(wrong, right, return_exceptions=True))  # type: ignore[return-value]

    wrong, right = asyncio.run(body())
    assert isinstance(wrong, ToolError)
    assert wrong.error_class is ErrorClass.IDEMPOTENCY_CONFLICT
    # The retry matches what the journal recorded under K: it must be a replay.
    assert not isinstance(right, BaseException), right
    assert right.call_id == "orig"


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


# ---------------------------------------------------------------------------------------
# Pinned (correct): a joiner of an in-flight owner never hangs, and passes its turn so a
# later call of its batch is not held up by the owner's run.


def test_joiner_passes_turn_and_gets_owner_outcome(client: Client, daemon: Daemon) -> None:
    run = _run()
    key = "j-" + run
    owner = Streamer(
        daemon.address, [_work("j.txt", write=True, seconds=1.0, call_id="o", key=key)], run_id=run
    )
    wait_until(lambda: owner.seen(EventKind.STARTED, "o"), "owner started")
    t0 = time.monotonic()
    events = list(
        client.stream(
            [
                _work("j.txt", write=True, seconds=1.0, call_id="j", key=key),
                Call(tool="noop", arguments={"echo": "hi"}, call_id="n"),
            ],
            run_id=run,
        )
    )
    finished = {e.call_id: e for e in events if e.kind is EventKind.FINISHED}
    first_finished = next(e.call_id for e in events if e.kind is EventKind.FINISHED)
    assert first_finished == "n"  # the noop did not wait for the owner
    assert time.monotonic() - t0 < 10
    assert finished["j"].outcome is not None
    assert finished["j"].outcome.replay_of == "o"
    owner.join(20)
