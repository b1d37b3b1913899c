"""Cancellation through a real daemon: the ladder's steps and what it leaves behind.

Each test drives `execgate serve` over gRPC and checks what really happened on
the host: the call's processes (found by an `EG_TAG` variable in their
environment, which survives setsid and double forks) and the files it wrote. The
ladder tests run on every sandbox backend this machine has (process, bwrap,
docker); the rest use a daemon on the default (`auto`) backend. Who a cancel
reaches (runs, batches, deadlines, shutdown) is in test_cancel_reach.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client, EventKind, Status, StopMode
from execgate.executor.sandbox import procscan
from tests.cancel_support import (
    COOPERATIVE,
    GRACE,
    SLACK,
    STUBBORN,
    AliveWatcher,
    Boxed,
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
from tests.daemon import Daemon, scaled
from tests.support import (
    SANDBOX_BACKENDS,
    Streamer,
    backend_name,
    comm,
    sandbox_serve_args,
    wait_until,
    work_pids,
    work_sleeping,
)

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
    yield from graced_daemon(tmp_path_factory, "cancel-plain")


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
    assert o.evidence.sandbox == backend_name(boxed.backend)
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


def test_a_background_child_holding_the_output_does_not_hold_the_call(boxed: Boxed) -> None:
    # The main process is done at once; its background `sleep` keeps stdout open. The
    # call ends when the main process does, and the leftover is killed with it.
    tag = new_tag()
    started = time.monotonic()
    o = boxed.client.run(sh("sleep 30 & echo hi", f"bg-{tag[:8]}", tag=tag, timeout=20))
    assert time.monotonic() - started < 5
    assert (o.status, o.stopped_how) == (Status.SUCCESS, StopMode.COMPLETED), o
    assert o.text == "hi\n"
    wait_until(lambda: tagged(tag) == [], "the leftover sleep to be gone")


def test_an_escape_the_process_sandbox_cannot_see_is_not_called_verified(
    tmp_path: Path,
) -> None:
    # Without cgroups, the process backend finds a call's processes by their group
    # and their marker. One that leaves both (setsid, empty environment) is out of
    # its sight -- but it still holds the call's stdout, and that is reported: the
    # survivors are unknown, not 0. (bwrap and docker contain it by namespace.)
    d = Daemon(tmp_path, "--sandbox", "process", "--no-cgroups", "--grace", "0.2").start()
    nap = f"3{uuid.uuid4().int % 1000}.25"  # a unique argv to find it by
    try:
        with Client(d.address) as c:
            # The main shell exits only once the escapee has shed the marker (it runs
            # with an empty environment and has written its pid), so the finishing
            # sweep cannot catch it half-way.
            script = (
                f"env -i setsid /bin/sh -c 'echo $$ > escaped; exec sleep {nap}' & "
                "while [ ! -s escaped ]; do sleep 0.01; done; echo started"
            )
            o = c.run(sh(script, "escape", timeout=20))
        assert o.status is Status.SUCCESS, o
        assert o.evidence.survivors is None
        assert "could not find" in o.message, o.message
        assert o.text == "started\n"
    finally:
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and (entry / "cmdline").read_bytes() == (
                    b"sleep\0" + nap.encode() + b"\0"
                ):
                    os.kill(int(entry.name), signal.SIGKILL)
        d.stop()


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


def test_run_deadline_is_kept_whatever_the_sandbox_start_costs(boxed: Boxed) -> None:
    name = f"dl-{new_tag()[:8]}"
    deadline = time.time() + 1.0
    [o] = boxed.client.execute([work(f"reader-{name}", name, seconds=30)], deadline=deadline)
    assert (o.status, o.error_class) == (Status.FAILURE, "timeout"), o
    # "Calls still running then are stopped": the stop is asked for at the deadline,
    # not after it (sandbox start included) and not before it.
    late = at(o, "cancel_requested") - deadline
    assert -0.05 < late < 0.1, late


def _bwrap_namespace_without_command(daemon: Daemon, tag: str) -> bool:
    """bwrap has made the call's PID namespace, and nothing but its init is in it yet."""
    if tagged(tag, "sh"):
        return False  # the command is running: too late
    assert daemon.proc is not None
    for bwrap in procscan.children(daemon.proc.pid):  # the daemon runs one call here
        if comm(bwrap) != "bwrap":
            continue
        kids = procscan.children(bwrap)
        ns = procscan.pid_namespace(kids[0]) if kids else None
        if ns is None or ns == procscan.pid_namespace(bwrap):
            return False
        return [p for p in procscan.in_namespace(ns) if p != kids[0]] == []
    return False


def test_bwrap_cancel_while_the_sandbox_is_being_built_is_still_polite(tmp_path: Path) -> None:
    # The cold mode's window: a warm call's start returns once its command runs.
    args = sandbox_serve_args("bwrap-cold", tmp_path)
    # 300 stacked read-only binds make bwrap take ~0.2 s to build the sandbox: a window
    # in which the call's PID namespace exists with only bwrap's init in it.
    slow = [a for _ in range(300) for a in ("--sandbox-ro", "/usr/share")]
    # The owed SIGTERM goes out once the command starts, so the grace must outlast the
    # sandbox's build, which a busy machine stretches past 1 s (a longer grace costs a
    # polite stop nothing: it ends as soon as the command honours the signal).
    grace = scaled(3 * GRACE)
    d = Daemon(tmp_path, *args, "--grace", str(grace), *slow).start()
    try:
        tag = new_tag()
        cid = f"early-{tag[:8]}"
        stream = Streamer(d.address, [sh(COOPERATIVE, cid, tag=tag)])
        wait_until(lambda: _bwrap_namespace_without_command(d, tag), "an empty sandbox namespace")
        with Client(d.address) as c:
            assert c.cancel(call_id=cid) == [cid]
        stream.join()
        o = stream.outcome(cid)
        signalled = detail(o, "signal_sent")
        assert "owed" in signalled, signalled  # the window was hit: nobody to signal yet
        # The command honours SIGTERM (or never starts): no grace period, no SIGKILL.
        assert o.stopped_how is StopMode.COOPERATIVE, (signalled, phases(o))
        assert at(o, "stopped") - at(o, "cancel_requested") < grace
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
