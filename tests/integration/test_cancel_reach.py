"""Cancellation through a real daemon: whom a Cancel reaches, and when.

Runs and batches, the journal record made before anything is signalled, run
deadlines, and daemon shutdown (SIGTERM drains; a second SIGTERM forces). The
ladder itself, per backend, is in test_cancel.py.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client, EventKind, Status, StopMode
from tests.cancel_support import (
    COOPERATIVE,
    GRACE,
    STUBBORN,
    at,
    detail,
    graced_daemon,
    in_order,
    journaled,
    new_tag,
    phases,
    sh,
    tagged,
    work,
)
from tests.daemon import Daemon
from tests.support import Streamer, wait_until, work_sleeping


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon on the default (`auto`) backend, for what does not depend on the backend."""
    yield from graced_daemon(tmp_path_factory, "cancel-plain")


@pytest.fixture(scope="module")
def pc(plain: Daemon) -> Iterator[Client]:
    with Client(plain.address) as c:
        yield c


# ---------------------------------------------------------------- whom a cancel reaches


def test_run_cancel_rejects_queued_calls_and_bars_the_run_across_restarts(
    tmp_path: Path,
) -> None:
    d = Daemon(tmp_path, "--grace", str(GRACE)).start()
    try:
        counter = d.workspace / "c"
        counter.write_text("7\n")
        run = f"run-{new_tag()[:8]}"
        queued = ["w1", "w2", "w3"]
        stream = Streamer(
            d.address,
            [work("w0", "c", write=True, seconds=30), *(work(w, "c", write=True) for w in queued)],
            run_id=run,
        )
        wait_until(lambda: stream.seen(EventKind.STARTED, "w0"), "the first call to start")
        for w in queued:
            wait_until(lambda w=w: stream.seen(EventKind.WAITING, w), f"{w} to wait for the lock")
        wait_until(lambda: work_sleeping(counter), "the first call's sleep")

        with Client(d.address) as c:
            hit = c.cancel(run_id=run, reason="agent stopped", requester="operator")
            assert sorted(hit) == ["w0", *queued]
            stream.join()
            first = stream.outcome("w0")
            assert (first.status, first.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled")
            for w in queued:
                o = stream.outcome(w)
                assert (o.status, o.error_class) == (Status.REJECTED, "cancelled"), o
                assert o.stopped_how is StopMode.NOT_STARTED
                assert o.mark("started") is None
                assert not stream.seen(EventKind.STARTED, w)
                journaled(c, o, run_id=run)
            assert counter.read_text() == "7\n", "a cancelled call incremented the counter"

            later = c.run(work("later", "c", write=True), run_id=run)
            assert (later.status, later.error_class) == (Status.REJECTED, "cancelled"), later
            assert later.field == "run_id"
            assert "agent stopped" in later.message
            fresh = c.run(work("fresh", "c", write=True), run_id=f"{run}-next")
            assert fresh.status is Status.SUCCESS, fresh
            assert counter.read_text() == "8\n"

        assert d.stop() == 0
        d.restart()
        with Client(d.address) as c:
            after = c.run(work("after-restart", "c", write=True), run_id=run)
            assert (after.status, after.error_class) == (Status.REJECTED, "cancelled"), after
            assert after.field == "run_id"
            assert "agent stopped" in after.message  # the bar came back from the journal
            other = c.run(work("other", "c", write=True), run_id=f"{run}-other")
            assert other.status is Status.SUCCESS, other
            assert counter.read_text() == "9\n"
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


def test_batch_cancel_reaches_only_that_batch(plain: Daemon, pc: Client) -> None:
    tag = new_tag()[:8]
    run, batch_a, batch_b = f"batches-{tag}", f"A-{tag}", f"B-{tag}"
    a = Streamer(
        plain.address,
        [work("a-long", f"a-{tag}", seconds=30), work("a-queued", f"a-{tag}", write=True)],
        run_id=run,
        batch_id=batch_a,
    )
    b = Streamer(
        plain.address, [work("b-run", f"b-{tag}", seconds=1.5)], run_id=run, batch_id=batch_b
    )
    wait_until(lambda: a.seen(EventKind.STARTED, "a-long"), "a-long to start")
    wait_until(lambda: a.seen(EventKind.WAITING, "a-queued"), "a-queued to wait")
    wait_until(lambda: b.seen(EventKind.STARTED, "b-run"), "b-run to start")

    assert sorted(pc.cancel(batch_id=batch_a)) == ["a-long", "a-queued"]
    a.join()
    # The other batch's call was running all along and is still running now.
    assert not b.seen(EventKind.FINISHED, "b-run")
    assert a.outcome("a-long").status is Status.FAILURE
    assert a.outcome("a-long").error_class == "cancelled"
    assert a.outcome("a-queued").status is Status.REJECTED
    assert not a.seen(EventKind.STARTED, "a-queued")

    b.join()
    untouched = b.outcome("b-run")
    assert untouched.status is Status.SUCCESS, untouched
    assert untouched.mark("cancel_requested") is None


def test_cancel_is_journaled_before_anything_is_signalled(plain: Daemon, pc: Client) -> None:
    tag = new_tag()
    cid = f"journal-{tag[:8]}"
    stream = Streamer(plain.address, [sh(COOPERATIVE, cid, tag=tag)])
    wait_until(lambda: tagged(tag, "sleep"), "the command's sleep")
    journal = plain.state_dir / "journal.db"

    # Hold the journal's write lock: the Cancel cannot be recorded, so nothing may happen.
    blocker = sqlite3.connect(journal, timeout=10, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    hit: list[str] = []
    canceller = threading.Thread(
        target=lambda: hit.extend(
            pc.cancel(call_id=cid, reason="journal first", requester=f"tester-{tag[:6]}")
        ),
        daemon=True,
    )
    try:
        canceller.start()
        # Absence of a signal can only be observed over a stretch of time.
        time.sleep(0.5)
        assert canceller.is_alive(), "Cancel returned before its request was journaled"
        assert tagged(tag, "sleep"), "the command was signalled before the Cancel was journaled"
        assert not stream.seen(EventKind.FINISHED, cid)
        released = time.time()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    canceller.join(10)
    assert hit == [cid]
    stream.join()
    o = stream.outcome(cid)
    assert o.error_class == "cancelled"

    ro = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        rows = ro.execute(
            "SELECT at, requester, reason, run_id, batch_id, grace FROM cancels WHERE call_id = ?",
            (cid,),
        ).fetchall()
    finally:
        ro.close()
    assert len(rows) == 1, rows
    row_at, requester, reason, run_id, batch_id, grace = rows[0]
    assert (requester, reason, run_id, batch_id, grace) == (
        f"local (says: tester-{tag[:6]})",  # the authenticated caller, then the claim
        "journal first",
        "default",
        "",
        None,
    )
    # One instant: the request's arrival, recorded, then carried by the call's mark.
    assert abs(row_at - at(o, "cancel_requested")) < 0.001
    assert row_at < released <= at(o, "signal_sent")


# ---------------------------------------------------------------- run deadline


def test_run_deadline_stops_running_calls_and_rejects_queued_ones(
    plain: Daemon, pc: Client
) -> None:
    tag = new_tag()[:8]
    counter = plain.workspace / f"dl-{tag}"
    t0 = time.time()
    deadline = t0 + 1.0
    reader, writer, behind = pc.execute(
        [
            work("dl-read", f"dl-read-{tag}", seconds=30),
            work("dl-write", counter.name, write=True, seconds=30),
            work("dl-behind", counter.name, write=True),
        ],
        run_id=f"deadline-{tag}",
        deadline=deadline,
    )
    assert time.time() - t0 < 1.0 + GRACE + 3
    # The read-only call, stopped by the ladder at the deadline: FAILURE/timeout.
    assert (reader.status, reader.error_class) == (Status.FAILURE, "timeout"), reader
    assert reader.stopped_how is StopMode.COOPERATIVE, phases(reader)
    in_order(reader, "started", "cancel_requested", "signal_sent", "stopped")
    assert abs(at(reader, "cancel_requested") - deadline) < 0.1
    assert (writer.status, writer.error_class) == (Status.UNKNOWN_OUTCOME, "timeout"), writer
    # Queued behind the writer's lock when the deadline passed: never started.
    assert (behind.status, behind.error_class) == (Status.REJECTED, "timeout"), behind
    assert behind.stopped_how is StopMode.NOT_STARTED
    assert behind.mark("started") is None
    assert not counter.exists()


# ---------------------------------------------------------------- daemon shutdown


def test_sigterm_stops_calls_in_flight_and_records_how(tmp_path: Path) -> None:
    # --locks none: two commands at once (each would otherwise hold the whole workspace).
    d = Daemon(tmp_path, "--grace", str(GRACE), "--locks", "none").start()
    try:
        polite, stubborn = new_tag(), new_tag()
        stream = Streamer(
            d.address,
            [sh(COOPERATIVE, "polite", tag=polite), sh(STUBBORN, "stubborn", tag=stubborn)],
        )
        wait_until(lambda: tagged(polite, "sleep"), "the cooperative command")
        wait_until(lambda: len(tagged(stubborn, "sleep")) >= 2, "the stubborn command")

        t0 = time.monotonic()
        assert d.stop(timeout=30) == 0
        assert time.monotonic() - t0 < GRACE + 4
        stream.join()
        assert stream.error is None
        assert tagged(polite) == []
        assert tagged(stubborn) == []

        d.restart()
        with Client(d.address) as c:
            expected = {"polite": StopMode.COOPERATIVE, "stubborn": StopMode.FORCE_TERMINATED}
            for cid, how in expected.items():
                rec = c.get_call(cid)
                assert not rec.running
                o = rec.outcome
                assert o is not None
                assert o.stopped_how is how, (cid, phases(o))
                assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled")
                assert "shutting down" in detail(o, "cancel_requested")
                assert o.mark("recovered") is None  # recorded by the ladder, not by recovery
                assert o.evidence.survivors == 0
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


def test_second_sigterm_ends_the_grace_period(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "--grace", "30").start()
    try:
        tag = new_tag()
        stream = Streamer(d.address, [sh(STUBBORN, "stubborn", tag=tag)])
        wait_until(lambda: len(tagged(tag, "sleep")) >= 2, "the stubborn command")
        assert d.proc is not None
        d.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "draining in-flight calls" in d.log(), "the daemon to start draining")
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(15) == 0
        assert time.monotonic() - t0 < 5  # not the 30 s grace period
        stream.join()
        assert tagged(tag) == []

        d.restart()
        with Client(d.address) as c:
            o = c.get_call("stubborn").outcome
            assert o is not None
            assert o.stopped_how is StopMode.FORCE_TERMINATED, phases(o)
            assert detail(o, "grace_expired") == "forced: no grace"
            assert at(o, "grace_expired") - at(o, "signal_sent") < 5
            assert o.evidence.survivors == 0
            assert o.mark("recovered") is None
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
