"""Crash recovery: a daemon killed with calls in flight, restarted on the same journal."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from execgate.client import (
    Call,
    Client,
    EventKind,
    ExecgateClientError,
    Status,
    StopMode,
)
from execgate.executor.core.outcomes import ErrorClass, Outcome, Phase
from execgate.executor.core.outcomes import Status as DStatus
from execgate.executor.core.outcomes import StopMode as DStopMode
from execgate.executor.journal.store import CallRecord, Journal
from tests.daemon import Daemon
from tests.support import Streamer, wait_until

# Runs on each journal store: SQLite, and PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.journals, pytest.mark.usefixtures("journal_store")]


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=5)


@pytest.fixture
def orphans() -> Iterator[list[psutil.Process]]:
    """Processes a test expects may outlive a killed daemon; killed at teardown."""
    procs: list[psutil.Process] = []
    yield procs
    kill_all(procs)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigkill_with_a_writer_in_flight(
    daemon: Daemon, client: Client, orphans: list[psutil.Process]
) -> None:
    done = client.run(
        Call(tool="write_file", arguments={"path": "a.txt", "content": "hello"}, call_id="w1")
    )
    assert done.status is Status.SUCCESS

    marker = daemon.workspace / "marker"
    slow = Call(
        tool="run_command",
        call_id="slow",
        idempotency_key="slow-key",
        arguments={"argv": ["sh", "-c", "echo started >> marker; exec sleep 60"]},
    )
    stream = Streamer(daemon.address, [slow])
    wait_until(lambda: stream.seen(EventKind.STARTED, "slow"), "the STARTED event")
    wait_until(marker.exists, "the command to write its marker")
    assert daemon.proc is not None
    children = descendants(daemon.proc.pid)
    sleeper = [p for p in children if p.name() == "sleep"]
    assert sleeper, f"the command's process is not a child of the daemon: {children}"
    orphans.extend(children)

    daemon.kill()
    stream.join()
    assert stream.error is not None  # the stream broke; it never got an outcome
    assert not stream.seen(EventKind.FINISHED, "slow")
    daemon.restart()
    # The command did not outlive its daemon for long: bwrap's --die-with-parent
    # kills the sandbox with the daemon, and a restarted daemon kills whatever is
    # left in its predecessor's cgroups (the process backend).
    wait_until(lambda: not any(_alive(p) for p in sleeper), "the orphaned command to die")
    rec = client.get_call("slow")
    assert not rec.running
    assert rec.may_write
    o = rec.outcome
    assert o is not None
    assert o.status is Status.UNKNOWN_OUTCOME
    assert o.error_class == "interrupted"
    assert o.stopped_how is StopMode.INTERRUPTED
    assert [m.phase for m in o.timeline] == ["started", "recovered"]
    assert "reconcile" in o.message

    # The call that finished before the crash is untouched, evidence and all.
    before = client.get_call("w1")
    assert before.outcome is not None
    assert before.outcome.status is Status.SUCCESS
    ev = before.outcome.evidence
    assert ev.bytes_written == 5
    assert ev.sha256_before == ""
    assert ev.sha256_after == sha256(b"hello")
    assert ev.path == str((daemon.workspace / "a.txt").resolve())
    assert (daemon.workspace / "a.txt").read_text() == "hello"

    # Nothing is left running in the journal.
    assert all(not r.running for r in client.list_calls())

    # Retrying with the same idempotency key does not run the command again: the
    # caller gets the recorded UNKNOWN_OUTCOME and must reconcile.
    retry = client.run(
        Call(
            tool=slow.tool,
            arguments=slow.arguments,
            call_id="slow-retry",
            idempotency_key="slow-key",
        )
    )
    assert retry.status is Status.UNKNOWN_OUTCOME
    assert retry.replay_of == "slow"
    assert marker.read_text() == "started\n"


def test_sigkill_with_a_reader_in_flight(daemon: Daemon, client: Client) -> None:
    """A read-only call interrupted by a crash is FAILURE/interrupted: safe to retry.

    A backtracking pattern keeps `search` busy (until its timeout) in flight. A
    writer of the searched file, queued behind it (it conflicts with the read), never
    started.
    """
    (daemon.workspace / "evil.txt").write_text("a" * 40 + "b\n")
    calls = [
        Call(
            tool="search",
            arguments={"pattern": "^(a|a)*$", "path": "evil.txt"},
            call_id="r1",
            timeout=30,
        ),
        Call(tool="write_file", arguments={"path": "evil.txt", "content": "x"}, call_id="w-queued"),
    ]
    stream = Streamer(daemon.address, calls)
    wait_until(
        lambda: stream.seen(EventKind.STARTED, "r1") or stream.seen(EventKind.FINISHED, "r1"),
        "the search to start",
    )
    wait_until(lambda: stream.seen(EventKind.WAITING, "w-queued"), "the writer to wait")
    if stream.seen(EventKind.FINISHED, "r1"):
        stream.join()
        pytest.skip(
            "the backtracking search no longer stays in flight; covered by the journal-level test"
        )
    # The writer's intent is journaled only once its locks are granted, just before it
    # starts: while it waits behind the search it has no row at all.
    assert not _exists(client, "w-queued")
    assert not stream.seen(EventKind.STARTED, "w-queued")

    daemon.kill()
    stream.join()
    daemon.restart()

    rec = client.get_call("r1")
    assert not rec.running
    assert not rec.may_write
    assert rec.outcome is not None
    assert rec.outcome.status is Status.FAILURE
    assert rec.outcome.error_class == "interrupted"
    assert rec.outcome.stopped_how is StopMode.INTERRUPTED
    assert "safe to retry" in rec.outcome.message

    # It never started: no record to reconcile, nothing written, safe to send again.
    assert not _exists(client, "w-queued")
    assert (daemon.workspace / "evil.txt").read_text() == "a" * 40 + "b\n"
    again = client.run(calls[1])
    assert again.status is Status.SUCCESS


def _exists(client: Client, call_id: str) -> bool:
    try:
        client.get_call(call_id)
    except ExecgateClientError:
        return False
    return True


# ---------------------------------------------------------------- the journal alone


def _rec(call_id: str, *, may_write: bool, key: str = "") -> CallRecord:
    return CallRecord(
        run_id="r",
        call_id=call_id,
        batch_id="b",
        tool="t",
        arguments_json="{}",
        request_hash="h-" + call_id,
        idempotency_key=key,
        agent="local",
        may_write=may_write,
        created_at=time.time(),
    )


def test_journal_recover_settles_running_rows(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    done = Outcome(status=DStatus.SUCCESS)

    async def write() -> None:
        j = Journal(path)
        try:
            await j.record_intent(_rec("writer", may_write=True, key="k"))
            await j.record_intent(_rec("reader", may_write=False))
            await j.record_intent(_rec("finished", may_write=True))
            await j.record_outcome("r", "finished", done, "raw", durable=True)
        finally:
            j.close()

    asyncio.run(write())

    async def check() -> None:
        j = Journal(path)  # a new daemon on the same file
        try:
            assert j.recover() == 2
            assert j.recover() == 0  # idempotent
            writer = await j.get("r", "writer")
            reader = await j.get("r", "reader")
            finished = await j.get("r", "finished", include_raw=True)
            assert writer is not None
            assert reader is not None
            assert finished is not None
            assert writer.outcome is not None
            assert reader.outcome is not None
            assert writer.outcome.status is DStatus.UNKNOWN_OUTCOME
            assert writer.outcome.error_class is ErrorClass.INTERRUPTED
            assert writer.outcome.stopped_how is DStopMode.INTERRUPTED
            assert [m.phase for m in writer.outcome.timeline] == [Phase.STARTED, Phase.RECOVERED]
            assert writer.outcome.timeline[0].at == writer.created_at
            assert reader.outcome.status is DStatus.FAILURE
            assert reader.outcome.error_class is ErrorClass.INTERRUPTED
            assert reader.outcome.stopped_how is DStopMode.INTERRUPTED
            assert finished.outcome == done
            assert finished.raw_result == "raw"
            # The key of the interrupted writer still answers with its (settled) record.
            by_key = await j.by_idempotency_key("local", "k")
            assert by_key is not None
            assert by_key.call_id == "writer"
            assert by_key.outcome is not None
            assert by_key.outcome.status is DStatus.UNKNOWN_OUTCOME
        finally:
            j.close()

    asyncio.run(check())
