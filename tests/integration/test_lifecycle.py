"""The daemon's life: files and modes, one daemon per socket, shutdown, cancel, disconnect,
scheduling of a batch, and the journal's listing."""

from __future__ import annotations

import itertools
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import psutil
import pytest

from execgate.client import (
    Call,
    CallRecord,
    Client,
    EventKind,
    ExecgateClientError,
    Outcome,
    Status,
    StopMode,
)
from execgate.v1 import executor_pb2 as pb
from execgate.v1 import executor_pb2_grpc as pb_grpc
from tests.daemon import Daemon
from tests.support import Streamer, wait_until

# ---------------------------------------------------------------- helpers


def finished(client: Client, call_id: str, timeout: float = 15.0) -> CallRecord:
    """Poll GetCall until the journal has the call's outcome."""
    found: list[CallRecord] = []

    def done() -> bool:
        try:
            rec = client.get_call(call_id)
        except ExecgateClientError:
            return False
        found[:] = [rec]
        return not rec.running

    wait_until(done, f"call {call_id} to finish", timeout)
    return found[0]


def at(o: Outcome, phase: str) -> float:
    m = o.mark(phase)
    assert m is not None, f"no {phase!r} mark in {[x.phase for x in o.timeline]}"
    return m.at


def sh(script: str, call_id: str, **kw: object) -> Call:
    return Call(tool="run_command", arguments={"argv": ["sh", "-c", script]}, call_id=call_id, **kw)  # type: ignore[arg-type]


def serve_cmd(workspace: Path, state_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "execgate.executor.cli",
        "serve",
        "--workspace",
        str(workspace),
        "--state-dir",
        str(state_dir),
        "--test-tools",
        *extra,
    ]


# ---------------------------------------------------------------- files, sockets, one daemon


def test_socket_state_dir_and_journal_are_owner_only(daemon: Daemon) -> None:
    assert stat.S_ISSOCK(os.stat(daemon.socket).st_mode)
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(daemon.state_dir).st_mode) == 0o700
    journal = daemon.state_dir / "journal.db"
    assert journal.exists()
    assert stat.S_IMODE(os.stat(journal).st_mode) & 0o077 == 0
    for path in daemon.state_dir.iterdir():  # -wal, -shm, locks: nothing for group/other
        assert stat.S_IMODE(os.lstat(path).st_mode) & 0o077 == 0, path


def test_existing_state_dir_is_tightened_to_0700(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    d.state_dir.mkdir(mode=0o755)
    os.chmod(d.state_dir, 0o755)
    d.start()
    try:
        assert stat.S_IMODE(os.stat(d.state_dir).st_mode) == 0o700
    finally:
        assert d.stop() == 0


def _assert_still_serving(daemon: Daemon, client: Client) -> None:
    assert daemon.proc is not None
    assert daemon.proc.poll() is None
    assert daemon.serving()
    assert client.execute_one("noop", echo="still here").text == "still here"


def test_second_daemon_on_the_same_state_dir_refuses(daemon: Daemon, client: Client) -> None:
    inode = os.stat(daemon.socket).st_ino
    second = subprocess.run(
        serve_cmd(daemon.workspace, daemon.state_dir),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=daemon.root,
    )
    assert second.returncode != 0
    err = second.stderr.strip()
    assert "Traceback" not in err
    assert err.startswith("execgate: "), err
    assert "another daemon" in err
    assert os.stat(daemon.socket).st_ino == inode  # not removed or replaced
    _assert_still_serving(daemon, client)


def test_second_daemon_on_the_same_socket_refuses(
    daemon: Daemon, client: Client, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    second = subprocess.run(
        serve_cmd(other / "workspace", other / "state", "--listen", daemon.address),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=daemon.root,
    )
    assert second.returncode != 0
    err = second.stderr.strip()
    assert "Traceback" not in err
    assert "another daemon is already listening on" in err
    assert str(daemon.socket) in err
    _assert_still_serving(daemon, client)


def test_stale_socket_from_a_killed_daemon_does_not_block_a_restart(
    daemon: Daemon, client: Client
) -> None:
    assert client.execute_one("noop", echo="before").ok
    daemon.kill()
    assert daemon.socket.exists()  # left behind: nobody listens on it
    assert not daemon.serving()
    daemon.restart()
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600
    _assert_still_serving(daemon, client)


# ---------------------------------------------------------------- shutdown


def test_sigterm_drains_a_running_command_and_records_it(daemon: Daemon, client: Client) -> None:
    marker = daemon.workspace / "marker"
    stream = Streamer(
        daemon.address,
        [sh("echo up > marker; exec sleep 30", "long"), sh("echo ran > ran.txt", "behind")],
    )
    wait_until(lambda: stream.seen(EventKind.STARTED, "long"), "the command to start")
    wait_until(lambda: stream.seen(EventKind.QUEUED, "behind"), "the second call to queue")
    wait_until(marker.exists, "the marker")
    assert daemon.proc is not None
    sleepers = [
        p for p in psutil.Process(daemon.proc.pid).children(recursive=True) if p.name() == "sleep"
    ]
    assert sleepers

    t0 = time.monotonic()
    assert daemon.stop() == 0
    assert time.monotonic() - t0 < 10
    stream.join()
    # The stream was not cut: it ended normally, with both outcomes.
    assert stream.error is None
    assert stream.outcome("long").error_class == "cancelled"
    assert stream.outcome("behind").status is Status.REJECTED
    assert not (daemon.workspace / "ran.txt").exists()
    # The drain stopped the command's whole process group: nothing is left behind.
    _gone, alive = psutil.wait_procs(sleepers, timeout=5)
    assert not alive

    daemon.restart()
    rec = client.get_call("long")
    assert not rec.running
    o = rec.outcome
    assert o is not None
    assert o.status is Status.UNKNOWN_OUTCOME  # it may have written: reconcile
    assert o.error_class == "cancelled"
    assert o.stopped_how is StopMode.COOPERATIVE
    cancel = o.mark("cancel_requested")
    assert cancel is not None
    assert "shutting down" in cancel.detail
    assert at(o, "cancel_requested") <= at(o, "stopped") <= at(o, "finished")
    # Not a crash: recovery had nothing to settle.
    assert o.mark("recovered") is None
    assert "recovered" not in daemon.log()
    behind = client.get_call("behind")
    assert behind.outcome is not None
    assert behind.outcome.status is Status.REJECTED
    assert behind.outcome.error_class == "cancelled"


# ---------------------------------------------------------------- cancel


def test_cancel_a_running_call(daemon: Daemon, client: Client) -> None:
    stream = Streamer(daemon.address, [sh("exec sleep 30", "c1")])
    wait_until(lambda: stream.seen(EventKind.STARTED, "c1"), "the call to start")
    t0 = time.monotonic()
    assert client.cancel(call_id="c1", reason="user pressed stop") == ["c1"]
    stream.join()
    assert time.monotonic() - t0 < 2.0  # well inside the 2 s grace, nowhere near 30 s
    o = stream.outcome("c1")
    assert o.status is Status.UNKNOWN_OUTCOME
    assert o.error_class == "cancelled"
    assert o.stopped_how is StopMode.COOPERATIVE
    phases = [m.phase for m in o.timeline]
    assert phases.index("started") < phases.index("cancel_requested") < phases.index("stopped")
    assert "force_terminated" not in phases
    cancel = o.mark("cancel_requested")
    assert cancel is not None
    assert cancel.detail == "user pressed stop (requested by local)"
    assert at(o, "stopped") - at(o, "cancel_requested") < 1.0
    rec = client.get_call("c1")
    assert rec.outcome is not None
    assert rec.outcome.status is Status.UNKNOWN_OUTCOME
    assert rec.outcome.error_class == "cancelled"
    # Nothing to cancel any more.
    assert client.cancel(call_id="c1") == []


def test_cancel_a_queued_call(daemon: Daemon, client: Client) -> None:
    stream = Streamer(daemon.address, [sh("exec sleep 30", "w1"), sh("echo ran > ran.txt", "w2")])
    wait_until(lambda: stream.seen(EventKind.STARTED, "w1"), "the first call to start")
    wait_until(lambda: stream.seen(EventKind.QUEUED, "w2"), "the second call to queue")
    assert client.cancel(call_id="w2") == ["w2"]
    wait_until(lambda: stream.seen(EventKind.FINISHED, "w2"), "the queued call's outcome")
    assert not stream.seen(EventKind.FINISHED, "w1")  # the running one is untouched

    queued = stream.outcome("w2")
    assert queued.status is Status.REJECTED
    assert queued.error_class == "cancelled"
    assert queued.stopped_how is StopMode.NOT_STARTED
    assert queued.mark("started") is None

    assert client.cancel(call_id="w1") == ["w1"]
    stream.join()
    assert stream.outcome("w1").error_class == "cancelled"
    assert not stream.seen(EventKind.STARTED, "w2")
    assert not (daemon.workspace / "ran.txt").exists()
    rec = client.get_call("w2")
    assert rec.outcome is not None
    assert rec.outcome.status is Status.REJECTED


def test_cancel_needs_a_target(daemon: Daemon, client: Client) -> None:
    with pytest.raises(ExecgateClientError, match="INVALID_ARGUMENT"):
        client.cancel(run_id="")
    # Naming a run alone is enough (the implicit run "default").
    assert client.cancel(run_id="default") == []


@pytest.mark.parametrize("target", ["batch", "run", "call"])
def test_cancel_targets_in_a_named_run(daemon: Daemon, client: Client, target: str) -> None:
    """A batch or a run is a target by itself; a call is named with its run."""
    stream = Streamer(
        daemon.address,
        [sh("exec sleep 30", "c1"), sh("echo x > x.txt", "c2")],
        run_id="named-run",
        batch_id="b-named",
    )
    wait_until(lambda: stream.seen(EventKind.STARTED, "c1"), "the call to start")
    wait_until(lambda: stream.seen(EventKind.QUEUED, "c2"), "the second call to queue")
    if target == "batch":
        hit = client.cancel(batch_id="b-named")
    elif target == "run":
        assert client.cancel(batch_id="b-named", run_id="another-run") == []
        hit = client.cancel(run_id="named-run")
    else:
        assert client.cancel(call_id="c2") == []  # not in the implicit run "default"
        hit = client.cancel(call_id="c2", run_id="named-run")
        assert hit == ["c2"]
        wait_until(lambda: stream.seen(EventKind.FINISHED, "c2"), "c2 to be rejected")
        hit += client.cancel(call_id="c1", run_id="named-run")
    assert sorted(hit) == ["c1", "c2"]
    stream.join()
    assert stream.outcome("c1").error_class == "cancelled"
    assert stream.outcome("c2").status is Status.REJECTED
    assert not (daemon.workspace / "x.txt").exists()


# ---------------------------------------------------------------- client disconnect


@pytest.mark.parametrize("how", ["grpc-cancel", "client-stream-closed"])
def test_client_disconnect_mid_stream(daemon: Daemon, client: Client, how: str) -> None:
    ws = daemon.workspace
    calls = [sh("sleep 1.5; echo done > first.txt", "d1"), sh("echo ran > second.txt", "d2")]
    if how == "grpc-cancel":
        request = pb.ExecuteRequest(
            calls=[
                pb.ToolCall(call_id=c.call_id, tool=c.tool, arguments_json=json.dumps(c.arguments))
                for c in calls
            ]
        )
        with grpc.insecure_channel(daemon.address) as channel:
            call = pb_grpc.ExecutorStub(channel).Execute(request)
            for msg in call:
                if msg.WhichOneof("kind") == "started":
                    assert msg.call_id == "d1"
                    break
            call.cancel()
    else:  # the agent stops reading the client's stream: that must cancel the RPC too
        with Client(daemon.address) as other:
            events = other.stream(calls)
            for event in events:
                if event.kind is EventKind.STARTED:
                    assert event.call_id == "d1"
                    break
            events.close()  # type: ignore[attr-defined]
            # The channel stays open: only dropping the stream may stop the queued call.
            second = finished(client, "d2")
            assert second.outcome is not None
            assert second.outcome.status is Status.REJECTED

    first = finished(client, "d1")
    assert first.outcome is not None
    assert first.outcome.status is Status.SUCCESS
    assert first.outcome.stopped_how is StopMode.COMPLETED
    assert (ws / "first.txt").read_text() == "done\n"

    second = finished(client, "d2")
    assert second.outcome is not None
    assert second.outcome.status is Status.REJECTED
    assert second.outcome.error_class == "cancelled"
    assert "disconnected" in second.outcome.message
    assert not (ws / "second.txt").exists()


# ---------------------------------------------------------------- scheduling within a batch


def test_reads_of_different_files_overlap(daemon: Daemon, client: Client) -> None:
    lines = "".join(
        f"line {i} of a file big enough to take a while to search\n" for i in range(40_000)
    )
    for name in ("one.txt", "two.txt"):
        (daemon.workspace / name).write_text(lines)
    a, b = client.execute(
        [
            Call(tool="search", arguments={"pattern": "no such text", "path": "one.txt"}),
            Call(tool="search", arguments={"pattern": "no such text", "path": "two.txt"}),
        ]
    )
    assert a.status is Status.SUCCESS
    assert b.status is Status.SUCCESS
    # Read-only calls share the workspace: each started before the other finished.
    assert at(a, "started") < at(b, "finished")
    assert at(b, "started") < at(a, "finished")


def test_writers_in_one_batch_never_overlap_and_keep_proposal_order(
    daemon: Daemon, client: Client
) -> None:
    calls = [sh(f"echo {i} >> order; sleep 0.05; echo {i} >> order", f"w{i}") for i in range(4)]
    outcomes = client.execute(calls)
    assert [o.status for o in outcomes] == [Status.SUCCESS] * 4
    for prev, nxt in itertools.pairwise(outcomes):
        assert at(nxt, "started") >= at(prev, "finished")
    assert (daemon.workspace / "order").read_text().split() == [
        "0",
        "0",
        "1",
        "1",
        "2",
        "2",
        "3",
        "3",
    ]


def test_a_writer_waits_for_readers_and_readers_for_it(daemon: Daemon, client: Client) -> None:
    (daemon.workspace / "f.txt").write_text("x\n")
    r1, w, r2 = client.execute(
        [
            Call(tool="read_file", arguments={"path": "f.txt"}),
            sh("sleep 0.2; echo y > f.txt", "writer"),
            Call(tool="read_file", arguments={"path": "f.txt"}),
        ]
    )
    assert at(w, "started") >= at(r1, "finished")
    assert at(r2, "started") >= at(w, "finished")
    assert r1.text == "x\n"
    assert r2.text == "y\n"


# ---------------------------------------------------------------- ListCalls


def test_list_calls_filters_and_pages(daemon: Daemon, client: Client) -> None:
    run = "listing"
    ids = []
    for i in range(3):
        o = client.run(Call(tool="noop", arguments={"echo": str(i)}, call_id=f"ok{i}"), run_id=run)
        assert o.ok
        ids.append(o.call_id)
    for i in range(2):
        o = client.run(
            Call(tool="read_file", arguments={"path": f"missing{i}"}, call_id=f"bad{i}"), run_id=run
        )
        assert o.status is Status.FAILURE
        ids.append(o.call_id)
    client.run(Call(tool="noop", call_id="elsewhere"), run_id="other-run")
    newest_first = ids[::-1]

    every = client.list_calls(run_id=run, limit=5)
    assert [r.call_id for r in every] == newest_first
    assert all(r.run_id == run and not r.running for r in every)
    assert [r.call_id for r in client.list_calls(run_id=run, limit=3)] == newest_first[:3]
    assert [r.call_id for r in client.list_calls(run_id=run, limit=1001)] == newest_first

    failed = client.list_calls(run_id=run, statuses=[Status.FAILURE])
    assert [r.call_id for r in failed] == ["bad1", "bad0"]
    assert [r.call_id for r in client.list_calls(run_id=run, tool="noop")] == ["ok2", "ok1", "ok0"]
    assert client.list_calls(run_id=run, tool="noop", statuses=[Status.FAILURE]) == []
    both = client.list_calls(run_id=run, statuses=[Status.FAILURE, Status.SUCCESS])
    assert len(both) == 5
    assert "elsewhere" in [r.call_id for r in client.list_calls()]  # no run: every run

    # The wire protocol pages: limit 2 over 5 calls is 2 + 2 + 1, newest first.
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.ExecutorStub(channel)
        pages: list[list[str]] = []
        token = ""
        while True:
            resp = stub.ListCalls(pb.ListCallsRequest(run_id=run, limit=2, page_token=token))
            pages.append([r.call_id for r in resp.calls])
            token = resp.next_page_token
            if not token:
                break
        assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:5]]
        with pytest.raises(grpc.RpcError) as info:
            stub.ListCalls(pb.ListCallsRequest(page_token="not-a-token"))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as info:
            stub.ListCalls(pb.ListCallsRequest(limit=-2))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        # The cap: at most 1000 per page, whatever is asked.
        resp = stub.ListCalls(pb.ListCallsRequest(run_id=run, limit=10**6))
        assert [r.call_id for r in resp.calls] == newest_first


def test_batch_outcomes_in_proposal_order_and_events_carry_the_index(
    daemon: Daemon, client: Client
) -> None:
    """Outcomes finish in any order; ExecuteBatch and the stream's index map them back."""
    calls = [
        Call(tool="run_command", arguments={"argv": ["sleep", "0.3"]}, call_id="slow"),
        Call(tool="noop", arguments={"echo": "quick"}, call_id="quick"),
        Call(tool="noop", arguments={"echo": "dup"}, call_id="quick"),  # duplicate id
    ]
    outcomes = client.execute(calls, run_id="order")
    assert [o.call_id for o in outcomes] == ["slow", "quick", "quick"]
    assert outcomes[0].status is Status.SUCCESS
    assert {outcomes[1].error_class, outcomes[2].error_class} == {"none", "duplicate_call_id"}

    events = list(client.stream(calls, run_id="order-stream"))
    finished = {e.index: e for e in events if e.kind is EventKind.FINISHED}
    assert sorted(finished) == [0, 1, 2]
    assert finished[0].call_id == "slow"
    queued = [e.index for e in events if e.kind is EventKind.QUEUED]
    assert sorted(queued) == [0, 1, 2]
