"""The lifecycle of MCP server processes, through the real daemon (bwrap, the fixture
server, one server per concern so that each one's processes and counts are its own):

- a start belongs to the server: a caller's short deadline or a Cancel ends the call,
  never the start (`slow`);
- one pool key's start does not hold up another key's calls (`gated`, per run);
- a crash loop backs off, 0.5 s doubling (`crashy`);
- a message over `max_message_kb` ends the process like a crash (`flood`, `floodro`);
- the server's `timeout_s` is its calls' default and ceiling (`timed`);
- a run's processes close when the run ends (`perrun`).

$FAULTY_START_GATE (tests/fixtures/mcp/faulty_server.py): while that file exists the
fixture server has not started, so a test holds a start for as long as it needs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execgate.client import Call, Client, EventKind, Outcome, Status
from execgate.client.loop.states import Machine, State
from tests import mcp_support as ms
from tests.daemon import Daemon, scaled
from tests.support import Streamer

pytestmark = pytest.mark.timeout(300)

NAMES = ("slow", "gated", "crashy", "flood", "floodro", "timed", "perrun")
POLICY = f"""\
version: 1
default: deny
rules:
  - id: mcp-tools
    effect: allow
    tools: {[f"{name}.*" for name in NAMES]}
    reason: the test's servers
"""
# Long enough that a held start never times out on its own while a test holds it.
HELD_START_S = 120


@dataclass(frozen=True)
class Lab:
    daemon: Daemon
    tags: dict[str, str]  # server name -> the EG_TAG of its processes

    def gate(self, name: str) -> Path:
        return self.daemon.workspace / f"{name}.gate"

    def pids(self, name: str) -> set[int]:
        return set(ms.tagged(self.tags[name]))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("mcp-lifecycle")
    tags = {name: ms.new_tag() for name in NAMES}
    ws = root / "workspace"
    fixture = ms.fixture_server()

    def gated(name: str) -> list[tuple[str, str]]:
        return [("FAULTY_START_GATE", str(ws / f"{name}.gate"))]

    servers = [
        ms.entry("slow", fixture, tags["slow"], env=gated("slow"), startup_timeout_s=HELD_START_S),
        ms.entry(
            "gated",
            fixture,
            tags["gated"],
            env=gated("gated"),
            startup_timeout_s=HELD_START_S,
            pool="run",
            trusted=True,  # echo is a reader: calls of two runs are not serialized
        ),
        ms.entry("crashy", fixture, tags["crashy"]),
        ms.entry("flood", fixture, tags["flood"], max_message_kb=64),
        ms.entry("floodro", fixture, tags["floodro"], max_message_kb=64, trusted=True),
        # prestart: its calls' 1 s must not also cover the process's start
        ms.entry("timed", fixture, tags["timed"], timeout_s=1, prestart=True),
        ms.entry("perrun", fixture, tags["perrun"], pool="run"),
    ]
    daemon = ms.mcp_daemon(root, servers, POLICY).start(timeout=120)
    yield Lab(daemon, tags)
    for name in NAMES:
        Lab(daemon, tags).gate(name).unlink(missing_ok=True)
    daemon.stop()
    gone = lambda: all(ms.tagged(t) == [] for t in tags.values())  # noqa: E731
    ms.wait_for(gone, 15, "every server process gone with the daemon")


@pytest.fixture
def eg(lab: Lab) -> Iterator[Client]:
    with Client(lab.daemon.address) as c:
        yield c


def test_a_callers_deadline_or_cancel_never_fails_the_start(lab: Lab, eg: Client) -> None:
    """The start is the server's, bounded by its own startup_timeout: a call that gives
    up ends `timeout`/`cancelled` (FAILURE: nothing was sent, though the tool writes),
    and the process it was waiting for comes up and serves the next call."""
    gate = lab.gate("slow")
    gate.touch()
    try:
        short = eg.run(Call(tool="slow.echo", arguments={"text": "a"}, timeout=1.0))
        assert (short.status, short.error_class) == (Status.FAILURE, "timeout"), short
        assert "still starting" in short.message, short
        starting = lab.pids("slow")
        assert starting, "the start goes on after the caller gave up"
        call = Call(tool="slow.echo", arguments={"text": "b"}, call_id="cancelled-in-start")
        stream = Streamer(lab.daemon.address, [call], run_id="slow-start")
        ms.wait_for(lambda: stream.seen(EventKind.STARTED, call.call_id), 20, "the call started")
        eg.cancel(call_id=call.call_id, run_id="slow-start", reason="enough")
        stream.join(scaled(20))
        cancelled = stream.outcome(call.call_id)
        assert (cancelled.status, cancelled.error_class) == (Status.FAILURE, "cancelled")
        state = ms.provider(eg, "slow")
        assert (state.running, state.restarts, state.last_error) == (0, 0, ""), state
        assert lab.pids("slow") == starting, "neither giving up killed the start"
    finally:
        gate.unlink()
    ms.wait_for(lambda: ms.provider(eg, "slow").running == 1, 30, "the held start done")
    again = eg.execute_one("slow.echo", text="served")
    assert (again.status, again.text) == (Status.SUCCESS, "served"), again
    assert lab.pids("slow") == starting, "the process that was starting serves the call"
    state = ms.provider(eg, "slow")
    assert (state.restarts, state.last_error) == (0, ""), state


def test_one_keys_start_does_not_hold_up_another_keys_calls(lab: Lab, eg: Client) -> None:
    """`pool: run`: run B's process serves B's calls while run A's process is starting."""
    first = eg.run(Call(tool="gated.echo", arguments={"text": "b"}), run_id="key-b")
    assert first.status is Status.SUCCESS, first
    b_process = lab.pids("gated")
    gate = lab.gate("gated")
    gate.touch()
    try:
        call = Call(tool="gated.echo", arguments={"text": "a"}, call_id="run-a-call")
        a_run = Streamer(lab.daemon.address, [call], run_id="key-a")
        ms.wait_for(lambda: lab.pids("gated") - b_process, 20, "run A's process starting")
        b_again = eg.run(Call(tool="gated.echo", arguments={"text": "b2"}), run_id="key-b")
        assert (b_again.status, b_again.text) == (Status.SUCCESS, "b2"), b_again
        assert not a_run.seen(EventKind.FINISHED, call.call_id), "run A's start is still held"
    finally:
        gate.unlink()
    a_run.join(scaled(30))
    a_done = a_run.outcome(call.call_id)
    assert (a_done.status, a_done.text) == (Status.SUCCESS, "a"), a_done
    assert ms.provider(eg, "gated").running == 2


def _gap(crash: Outcome, after: Outcome) -> float:
    """Seconds from the crash seen to the next call's end (its new process was ready)."""
    stopped, finished = crash.mark("stopped"), after.mark("finished")
    assert stopped is not None
    assert finished is not None
    return finished.at - stopped.at


def test_a_crash_loop_backs_off(lab: Lab, eg: Client) -> None:
    """Each crash counts: the next process starts 0.5 s, 1 s, 2 s, 4 s after it; a call
    whose deadline ends first fails at once (sandbox_error, "next try in")."""
    for n, backoff in enumerate((0.5, 1.0, 2.0), start=1):
        crash = eg.execute_one("crashy.crash", code=5)
        assert (crash.status, crash.error_class) == (Status.UNKNOWN_OUTCOME, "interrupted")
        after = eg.execute_one("crashy.echo", text=f"after crash {n}")
        assert after.status is Status.SUCCESS, after
        # The crash is seen (and the backoff counted from) just before its `stopped` mark.
        assert _gap(crash, after) >= backoff - 0.1, (n, _gap(crash, after))
    crash = eg.execute_one("crashy.crash", code=5)
    assert crash.status is Status.UNKNOWN_OUTCOME, crash
    hurried = eg.run(Call(tool="crashy.echo", arguments={"text": "now"}, timeout=1.0))
    assert (hurried.status, hurried.error_class) == (Status.FAILURE, "sandbox_error"), hurried
    assert "next try in" in hurried.message, hurried
    state = ms.provider(eg, "crashy")
    assert state.restarts == 4, state
    assert "exited (status 5)" in state.last_error, state
    patient = eg.execute_one("crashy.echo", text="patient")
    assert patient.status is Status.SUCCESS, patient
    assert _gap(crash, patient) >= 4.0 - 0.1


def test_a_message_over_the_bound_ends_the_process(lab: Lab, eg: Client) -> None:
    """1 MiB without a newline against `max_message_kb: 64`: the call is INTERRUPTED
    (a writer: UNKNOWN_OUTCOME; a trusted reader: FAILURE), the process tree is killed,
    and the next call gets a new process."""
    wrote = eg.execute_one("flood.flood_raw", kilobytes=1024)
    assert (wrote.status, wrote.error_class) == (Status.UNKNOWN_OUTCOME, "interrupted"), wrote
    assert "exceeded 65536 bytes" in wrote.message, wrote
    ms.wait_for(lambda: not lab.pids("flood"), 15, "the flooding server's tree killed")
    state = ms.provider(eg, "flood")
    assert (state.running, state.restarts) == (0, 1), state
    assert "exceeded 65536 bytes" in state.last_error, state
    again = eg.execute_one("flood.echo", text="fresh")
    assert (again.status, again.text) == (Status.SUCCESS, "fresh"), again
    read = eg.execute_one("floodro.flood_raw", kilobytes=1024)
    assert (read.status, read.error_class) == (Status.FAILURE, "interrupted"), read
    ms.wait_for(lambda: not lab.pids("floodro"), 15, "the reader's flooding tree killed")


def test_the_servers_timeout_is_its_calls_default_and_ceiling(eg: Client) -> None:
    """`timeout_s: 1` on the server: a call that asks for none, and one that asks for
    more, are both stopped after 1 s (the daemon's default would be 60 s)."""
    for asked in (None, scaled(60)):
        _warm(eg, "timed")  # the first stop killed it: a new start is not the call's time
        o = eg.run(Call(tool="timed.hang", timeout=asked))
        assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "timeout"), o
        started, stopping = o.mark("started"), o.mark("cancel_requested")
        assert started is not None
        assert stopping is not None
        assert 0.9 <= stopping.at - started.at < scaled(20), (asked, o.timeline)


def _warm(eg: Client, server: str) -> None:
    """Until the server's process is up: a call cut short by the 1 s ceiling while it
    starts (on a loaded machine) leaves the start going on for the next one."""
    deadline = time.monotonic() + scaled(60)
    while (
        eg.run(Call(tool=f"{server}.echo", arguments={"text": "up"})).status is not Status.SUCCESS
    ):
        assert time.monotonic() < deadline, f"{server} never came up"


def test_a_runs_processes_close_when_the_run_ends(lab: Lab, eg: Client) -> None:
    """`pool: run`: the run's process lives while the run does, and is closed when the
    run reaches a terminal state (not left to the LRU cap)."""
    ms.wait_for(lambda: not lab.pids("perrun"), 10, "discovery's process closed")
    run = eg.runs.start("a run with its own server process")
    o = eg.run(Call(tool="perrun.echo", arguments={"text": "mine"}), run_id=run.run_id)
    assert (o.status, o.text) == (Status.SUCCESS, "mine"), o
    assert lab.pids("perrun"), "the run's process is up"
    other = eg.run(Call(tool="perrun.echo", arguments={"text": "other"}), run_id="not-ended")
    assert other.status is Status.SUCCESS, other
    others = lab.pids("perrun")
    machine = Machine(run.run_id)
    eg.runs.append(run.run_id, [machine.advance(State.CANCELLED, "done with it")])
    ms.wait_for(lambda: lab.pids("perrun") < others, 15, "the run's process tree gone")
    assert lab.pids("perrun"), "the other run's process stays"
    assert ms.provider(eg, "perrun").running == 1


def _answers(eg: Client, tool: str) -> bool:
    return eg.execute_one(tool, text="up").status is Status.SUCCESS
