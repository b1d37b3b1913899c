"""Cancellation through a real daemon: the ladder's steps, what it leaves behind, and
who it reaches.

Each test drives `execgate serve` over gRPC and checks what really happened on
the host: the call's processes (found by an `EG_TAG` variable in their
environment, which survives setsid and double forks), the files it wrote, the
journal on disk. The ladder tests run on every sandbox backend this machine has
(process, bwrap, docker); the rest use a daemon on the default (`auto`) backend.

Every daemon here uses a grace period of GRACE seconds unless a test says
otherwise.
"""

from __future__ import annotations

import itertools
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execgate.client import Call, Client, EventKind, Outcome, Status, StopMode
from execgate.executor.sandbox import procscan
from tests.daemon import Daemon
from tests.support import SANDBOX_BACKENDS, Streamer, sandbox_serve_args, wait_until

GRACE = 1.0
# How late the ladder may take a step it scheduled (event loop, /proc scans, docker).
SLACK = 0.5

# A shell that exits at once on SIGTERM; its `sleep` dies with the signal too.
COOPERATIVE = 'trap "exit 0" TERM; sleep 1000 & wait'
# Ignores SIGTERM, and leaves its session and process group through a double fork
# into a setsid grandchild that ignores SIGTERM as well.
STUBBORN = 'trap "" TERM; (setsid sh -c "trap \\"\\" TERM; sleep 1000" &); sleep 1000'


# ---------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Boxed:
    """A daemon on one sandbox backend, and a client of it."""

    backend: str
    daemon: Daemon
    client: Client


def new_tag() -> str:
    return uuid.uuid4().hex


def sh(script: str, call_id: str, *, tag: str = "", timeout: float | None = None) -> Call:
    arguments: dict[str, object] = {"argv": ["sh", "-c", script]}
    if tag:
        arguments["env"] = {"EG_TAG": tag}
    return Call(tool="run_command", arguments=arguments, call_id=call_id, timeout=timeout)


def work(call_id: str, path: str, *, write: bool = False, seconds: float = 0) -> Call:
    return Call(
        tool="work",
        arguments={"path": path, "write": write, "seconds": seconds},
        call_id=call_id,
    )


def tagged(tag: str, comm: str | None = None) -> list[int]:
    """Live host pids whose environment has EG_TAG=tag (and whose name is `comm`)."""
    pids = procscan.with_marker("EG_TAG", tag)
    if comm is None:
        return pids
    return [p for p in pids if _comm(p) == comm]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def work_pids(path: Path) -> list[int]:
    """Live host pids of the shell of a `work` call on `path` (argv: sh -c SCRIPT sh PATH ...).

    Not the sandbox's own processes (the cgroup-joining /bin/sh, prlimit, bwrap), whose
    argv carries the path too: they exist before the command runs.
    """
    want = str(path.resolve()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\x00")
        except OSError:
            continue
        if argv[:2] == [b"sh", b"-c"] and argv[4:5] == [want] and procscan.alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def work_sleeping(path: Path) -> bool:
    """A `work` call on `path` is in its sleep: it has read the file, and not written it yet."""
    return any(_comm(kid) == "sleep" for pid in work_pids(path) for kid in procscan.children(pid))


def at(o: Outcome, phase: str) -> float:
    m = o.mark(phase)
    assert m is not None, f"no {phase!r} mark in {phases(o)}"
    return m.at


def phases(o: Outcome) -> list[str]:
    return [m.phase for m in o.timeline]


def in_order(o: Outcome, *names: str) -> None:
    """Each phase is marked, each strictly after the one before it."""
    times = [at(o, n) for n in names]
    shown = [(n, f"{t:.6f}") for n, t in zip(names, times, strict=True)]
    for earlier, later in itertools.pairwise(times):
        assert earlier < later, shown


def detail(o: Outcome, phase: str) -> str:
    m = o.mark(phase)
    assert m is not None, f"no {phase!r} mark in {phases(o)}"
    return m.detail


def journaled(client: Client, o: Outcome, run_id: str | None = None) -> Outcome:
    """The journal's record of the call agrees with the outcome the stream reported."""
    rec = client.get_call(o.call_id, run_id=run_id)
    assert not rec.running
    assert rec.outcome is not None
    assert (rec.outcome.status, rec.outcome.error_class, rec.outcome.stopped_how) == (
        o.status,
        o.error_class,
        o.stopped_how,
    )
    return rec.outcome


class AliveWatcher:
    """Samples the tagged processes in a thread; remembers the last moment one was seen."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        # Start time of the last scan that found a tagged process alive: the process
        # was alive at some moment after it.
        self.last_alive = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.time()
            if tagged(self.tag):
                self.last_alive = began
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


# ---------------------------------------------------------------- daemons


@pytest.fixture(scope="module", params=SANDBOX_BACKENDS)
def boxed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Boxed]:
    """One daemon per backend for the whole module."""
    backend: str = request.param
    root = tmp_path_factory.mktemp(f"cancel-{backend}")
    d = Daemon(root, *sandbox_serve_args(backend, root), "--grace", str(GRACE)).start()
    try:
        with Client(d.address) as c:
            yield Boxed(backend, d, c)
    finally:
        if d.proc is not None and d.proc.poll() is None:
            assert d.stop() == 0


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon on the default (`auto`) backend, for what does not depend on the backend."""
    d = Daemon(tmp_path_factory.mktemp("cancel-plain"), "--grace", str(GRACE)).start()
    yield d
    if d.proc is not None and d.proc.poll() is None:
        assert d.stop() == 0


@pytest.fixture(scope="module")
def pc(plain: Daemon) -> Iterator[Client]:
    with Client(plain.address) as c:
        yield c


# ---------------------------------------------------------------- the ladder, per backend


def test_cooperative_stop(boxed: Boxed) -> None:
    tag = new_tag()
    cid = f"coop-{tag[:8]}"
    reason, requester = f"user pressed stop {tag[:6]}", f"tester-{tag[:6]}"
    stream = Streamer(boxed.daemon.address, [sh(COOPERATIVE, cid, tag=tag)])
    wait_until(lambda: stream.seen(EventKind.STARTED, cid), "the call to start")
    # Its sleep runs only once the trap is set: from then on SIGTERM is handled.
    wait_until(lambda: tagged(tag, "sleep"), "the command's sleep")

    assert boxed.client.cancel(call_id=cid, reason=reason, requester=requester) == [cid]
    stream.join()
    o = stream.outcome(cid)
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled"), o
    assert o.stopped_how is StopMode.COOPERATIVE, phases(o)
    in_order(o, "started", "cancel_requested", "signal_sent", "stopped", "finished")
    assert "grace_expired" not in phases(o)
    assert "force_terminated" not in phases(o)
    # It went at the first signal: nowhere near the grace period.
    assert at(o, "stopped") - at(o, "cancel_requested") < 0.5
    assert o.evidence.survivors == 0
    assert o.evidence.sandbox == boxed.backend
    asked = detail(o, "cancel_requested")
    assert reason in asked, asked
    assert requester in asked, asked
    assert tagged(tag) == []
    journaled(boxed.client, o)


def test_force_kills_a_setsid_grandchild_that_ignores_sigterm(boxed: Boxed) -> None:
    tag = new_tag()
    cid = f"force-{tag[:8]}"
    stream = Streamer(boxed.daemon.address, [sh(STUBBORN, cid, tag=tag)])
    wait_until(lambda: stream.seen(EventKind.STARTED, cid), "the call to start")
    # Both sleeps run: the outer shell's and the escaped grandchild's, each past its trap.
    wait_until(lambda: len(tagged(tag, "sleep")) >= 2, "both sleeps")
    assert len(tagged(tag)) >= 2
    watcher = AliveWatcher(tag)

    assert boxed.client.cancel(call_id=cid, reason="force it") == [cid]
    stream.join(GRACE + 15)
    watcher.stop()
    o = stream.outcome(cid)
    assert tagged(tag) == [], "a process of the call survived the ladder"
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled"), o
    assert o.stopped_how is StopMode.FORCE_TERMINATED, phases(o)
    in_order(
        o,
        "cancel_requested",
        "signal_sent",
        "grace_expired",
        "force_terminated",
        "stopped",
    )
    waited = at(o, "grace_expired") - at(o, "signal_sent")
    assert GRACE - 0.05 <= waited <= GRACE + SLACK, waited
    assert o.evidence.survivors == 0
    assert "no process of the call is left" in detail(o, "stopped")
    # `stopped` is when the last process was gone: not before we last saw one alive,
    # not after the outcome was made.
    assert watcher.last_alive > 0
    assert watcher.last_alive <= at(o, "stopped") <= at(o, "finished")
    assert at(o, "force_terminated") <= at(o, "stopped")
    journaled(boxed.client, o)


def test_writer_stopped_midway_is_unknown_outcome(boxed: Boxed) -> None:
    tag = new_tag()
    cid = f"writer-{tag[:8]}"
    begun = boxed.daemon.workspace / f"begun-{tag[:8]}"
    stream = Streamer(
        boxed.daemon.address, [sh(f"echo begun > {begun.name}; sleep 1000", cid, tag=tag)]
    )
    # It has written something: whatever it does next, the result is not known.
    wait_until(begun.exists, "the command's first write")
    wait_until(lambda: tagged(tag, "sleep"), "the command's sleep")
    assert boxed.client.cancel(call_id=cid) == [cid]
    stream.join()
    o = stream.outcome(cid)
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled"), o
    assert o.stopped_how is StopMode.COOPERATIVE, phases(o)
    assert "begun" in begun.read_text()
    assert tagged(tag) == []
    journaled(boxed.client, o)


def test_reader_stopped_is_failure(boxed: Boxed) -> None:
    name = f"ro-{new_tag()[:8]}"
    cid = f"reader-{name}"
    stream = Streamer(boxed.daemon.address, [work(cid, name, seconds=30)])
    wait_until(lambda: stream.seen(EventKind.STARTED, cid), "the call to start")
    path = boxed.daemon.workspace / name
    wait_until(lambda: work_sleeping(path), "the work process to sleep")
    assert boxed.client.cancel(call_id=cid) == [cid]
    stream.join()
    o = stream.outcome(cid)
    # It only read: stopping it cannot have changed anything.
    assert (o.status, o.error_class) == (Status.FAILURE, "cancelled"), o
    assert o.stopped_how is StopMode.COOPERATIVE, phases(o)
    assert at(o, "stopped") - at(o, "cancel_requested") < 5  # not the 30 s it asked for
    assert work_pids(path) == []
    assert not path.exists()
    journaled(boxed.client, o)


def test_run_deadline_is_kept_whatever_the_sandbox_start_costs(
    boxed: Boxed, request: pytest.FixtureRequest
) -> None:
    name = f"dl-{new_tag()[:8]}"
    deadline = time.time() + 1.0
    [o] = boxed.client.execute([work(f"reader-{name}", name, seconds=30)], deadline=deadline)
    assert (o.status, o.error_class) == (Status.FAILURE, "timeout"), o
    # "Calls still running then are stopped": the stop is asked for at the deadline.
    assert at(o, "cancel_requested") - deadline < 0.1, at(o, "cancel_requested") - deadline


def _bwrap_namespace_without_command(tag: str) -> bool:
    """bwrap has made the call's PID namespace, and nothing but its init is in it yet."""
    if tagged(tag, "sh"):
        return False  # the command is running: too late
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or _comm(int(entry.name)) != "bwrap":
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\x00")
        except OSError:
            continue
        if tag.encode() not in argv:  # bwrap ... --setenv EG_TAG <tag> ...
            continue
        bwrap = int(entry.name)
        kids = procscan.children(bwrap)
        ns = procscan.pid_namespace(kids[0]) if kids else None
        if ns is None or ns == procscan.pid_namespace(bwrap):
            return False
        return [p for p in procscan.in_namespace(ns) if p != kids[0]] == []
    return False


def test_bwrap_cancel_while_the_sandbox_is_being_built_is_still_polite(tmp_path: Path) -> None:
    args = sandbox_serve_args("bwrap", tmp_path)
    # 300 stacked read-only binds make bwrap take ~0.2 s to build the sandbox: a window
    # in which the call's PID namespace exists with only bwrap's init in it.
    slow = [a for _ in range(300) for a in ("--sandbox-ro", "/usr/share")]
    d = Daemon(tmp_path, *args, "--grace", str(GRACE), *slow).start()
    try:
        tag = new_tag()
        cid = f"early-{tag[:8]}"
        stream = Streamer(d.address, [sh(COOPERATIVE, cid, tag=tag)])
        wait_until(lambda: _bwrap_namespace_without_command(tag), "an empty sandbox namespace")
        with Client(d.address) as c:
            assert c.cancel(call_id=cid) == [cid]
        stream.join()
        o = stream.outcome(cid)
        signalled = detail(o, "signal_sent")
        # The command honours SIGTERM (or never starts): no grace period, no SIGKILL.
        assert o.stopped_how is StopMode.COOPERATIVE, (signalled, phases(o))
        assert at(o, "stopped") - at(o, "cancel_requested") < GRACE
        assert tagged(tag) == []
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


# ---------------------------------------------------------------- grace, timeout


def test_cancel_grace_overrides_the_daemons(plain: Daemon, pc: Client) -> None:
    tag = new_tag()
    cid = f"grace-{tag[:8]}"
    stream = Streamer(plain.address, [sh("trap '' TERM; sleep 1000", cid, tag=tag)])
    wait_until(lambda: tagged(tag, "sleep"), "the command's sleep")
    assert pc.cancel(call_id=cid, grace=0.2) == [cid]
    stream.join()
    o = stream.outcome(cid)
    assert o.stopped_how is StopMode.FORCE_TERMINATED, phases(o)
    waited = at(o, "grace_expired") - at(o, "signal_sent")
    assert 0.15 <= waited <= 0.2 + SLACK, waited
    assert waited < GRACE  # not the daemon's grace period
    assert detail(o, "grace_expired") == "after 0.2s"
    assert tagged(tag) == []


def test_timeout_takes_the_same_ladder(plain: Daemon, pc: Client) -> None:
    tag = new_tag()
    cid = f"timeout-{tag[:8]}"
    stream = Streamer(plain.address, [sh("trap '' TERM; sleep 1000", cid, tag=tag, timeout=0.5)])
    stream.join(GRACE + 15)
    o = stream.outcome(cid)
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "timeout"), o
    assert o.stopped_how is StopMode.FORCE_TERMINATED, phases(o)
    in_order(
        o,
        "started",
        "cancel_requested",
        "signal_sent",
        "grace_expired",
        "force_terminated",
        "stopped",
    )
    assert detail(o, "cancel_requested").startswith("timeout"), detail(o, "cancel_requested")
    # The stop is asked for at the deadline, 0.5 s after the command started.
    assert 0.45 <= at(o, "cancel_requested") - at(o, "started") <= 0.5 + SLACK
    waited = at(o, "grace_expired") - at(o, "signal_sent")
    assert GRACE - 0.05 <= waited <= GRACE + SLACK, waited
    assert o.evidence.survivors == 0
    assert tagged(tag) == []
    journaled(pc, o)


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
        f"tester-{tag[:6]}",
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
