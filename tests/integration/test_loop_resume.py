"""Resuming a run whose client died: `Loop.resume(run_id)` picks the run up from the
daemon's record (its transitions and its calls) and never runs a tool twice.

The main test kills a real client process (SIGKILL) while its first command sleeps; the
daemon keeps the call running, and a new Loop resumes the run. The others put a run in
a given state by appending the transitions a dead loop would have left (`Machine`), and
check that resuming from there sends each call exactly once. Commands append a line to a
counter file in the workspace, so "ran twice" is a line too many.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from execgate.client import Call, Client, Loop, LoopResult, Status
from execgate.client.loop.record import turn_json
from execgate.client.loop.states import Machine, State
from execgate.client.models.base import Message, ToolCall, Turn, Usage
from execgate.client.models.scripted import ScriptedModel
from tests.daemon import Daemon
from tests.loop_support import (
    ASK_POLICY,
    TOKENS,
    Background,
    as_,
    assert_continuous,
    edges,
    lines,
    outcome_of,
    start_auth_daemon,
    start_daemon,
    state_of,
    stop,
    terminal,
)
from tests.support import Streamer, wait_until

S = ScriptedModel

DRIVER = """\
import sys
import threading

from execgate.client import Client, Loop
from execgate.client.models.scripted import ScriptedModel as S

address, run_id, counter = sys.argv[1:4]
model = S([
    S.calls(("run_command", {"argv": ["sh", "-c", f"echo one >> {counter}; sleep 3"]})),
    S.calls(("run_command", {"argv": ["sh", "-c", f"echo two >> {counter}"]})),
    S.answer("counted to two"),
])
with Client(address) as client:
    result = Loop(client, model).run("count to two", run_id=run_id)
print(result.state.value, flush=True)
"""

PARKING_DRIVER = """\
import sys
import threading

from execgate.client import Client, Loop
from execgate.client.models.scripted import ScriptedModel as S

address, token, run_id = sys.argv[1:4]
model = S([
    S.calls(("run_command", {"argv": ["tee", "-a", "approved.txt"], "stdin": "ran\\n"})),
    S.answer("never reached"),
])
with Client(address, token=token) as client:
    Loop(client, model).run("append a line, once approved", run_id=run_id)
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("resume"))
    yield d
    stop(d)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_auth_daemon(tmp_path_factory.mktemp("resume-guarded"), ASK_POLICY)
    yield d
    stop(d)


@pytest.fixture(scope="module")
def eg(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.address) as c:
        yield c


def sh(script: str) -> dict[str, Any]:
    return {"argv": ["sh", "-c", script]}


class Driver:
    """A loop in its own process (`source` run with this interpreter), to be SIGKILLed."""

    def __init__(self, tmp_path: Path, source: str, *args: str) -> None:
        script = tmp_path / "driver.py"
        script.write_text(source)
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def alive(self) -> bool:
        """True while it runs; an AssertionError with its output if it ended by itself."""
        if self.proc.poll() is None:
            return True
        out, err = self.proc.communicate()
        raise AssertionError(f"the driver ended early ({self.proc.returncode}): {out!r} {err!r}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc.communicate()


def turn_calling(*calls: tuple[str, dict[str, Any]]) -> Turn:
    """A model turn as a loop would have recorded it (ids call_1, call_2, ...)."""
    tool_calls = tuple(
        ToolCall(f"call_{i}", name, args) for i, (name, args) in enumerate(calls, start=1)
    )
    return Turn("", tool_calls, Usage(), "tool_calls")


def left_by_a_dead_loop(client: Client, run_id: str, turn: Turn, *, sent: bool) -> Machine:
    """The record of a loop that died after its first model turn was recorded: in
    `validating`, or (`sent`) in `running_tools` with the turn's calls planned."""
    client.runs.start("count", run_id=run_id)
    m = Machine(run_id)
    events = [
        m.advance(State.REQUESTING_MODEL, "run started"),
        m.advance(State.VALIDATING, "model replied", turn_json(turn)),
    ]
    if sent:
        planned = [
            {
                "call_id": f"s1c{i + 1}",
                "index": i,
                "model_id": c.id,
                "tool": c.name,
                "arguments": c.arguments,
            }
            for i, c in enumerate(turn.tool_calls)
        ]
        events.append(
            m.advance(State.RUNNING_TOOLS, "call(s) sent", {"calls": planned, "refused": []})
        )
    client.runs.append(run_id, events)
    return m


def the_call(run_id: str, script: str, call_id: str = "s1c1") -> Call:
    """The call as the dead loop sent it: its id and idempotency key fixed by the loop."""
    return Call(
        tool="run_command",
        arguments=sh(script),
        call_id=call_id,
        idempotency_key=f"{run_id}:{call_id}",
    )


def results_seen(request: Sequence[Message]) -> list[tuple[str, bool, str]]:
    [message] = [m for m in request if m.role == "tool_results"][-1:]
    return [(r.call_id, r.is_error, r.content) for r in message.results]


# ---------------------------------------------------------------- a client killed mid-run


def test_a_killed_client_resumes_without_running_any_tool_twice(
    daemon: Daemon, eg: Client, tmp_path: Path
) -> None:
    run_id = "killed-client"
    counter = daemon.workspace / "counter.txt"
    driver = Driver(tmp_path, DRIVER, daemon.address, run_id, "counter.txt")
    try:
        wait_until(lambda: driver.alive() and lines(counter) == ["one"], "the first command")
        assert state_of(eg, run_id) is State.RUNNING_TOOLS
        killed_at = time.time()
    finally:
        driver.kill()
    assert driver.proc.returncode == -signal.SIGKILL

    # The client is gone; its call is not: the daemon keeps running it.
    before = eg.runs.get(run_id)
    assert before.run.state is State.RUNNING_TOOLS
    [record] = before.calls
    assert (record.call_id, record.running, record.outcome) == ("s1c1", True, None)

    model = S([S.calls(("run_command", sh("echo two >> counter.txt"))), S.answer("counted")])
    result = Loop(eg, model).resume(run_id)

    assert (result.state, result.answer) == (State.COMPLETED, "counted")
    assert lines(counter) == ["one", "two"]
    # The resumed model saw the first call's result, rebuilt from the journal.
    assert [m.role for m in model.requests[0]] == ["user", "assistant", "tool_results"]
    [(call_id, is_error, _)] = results_seen(model.requests[0])
    assert (call_id, is_error) == ("call_1", False)
    assert len(model.requests) == 2

    detail = eg.runs.get(run_id)
    assert_continuous(run_id, detail.events)
    assert edges(detail.events)[before.run.last_seq :] == [
        ("running_tools", "requesting_model"),
        ("requesting_model", "validating"),
        ("validating", "running_tools"),
        ("running_tools", "requesting_model"),
        ("requesting_model", "validating"),
        ("validating", "completed"),
    ]
    # One record per call, each run once; the first ran to its end after its client died.
    assert [c.call_id for c in detail.calls] == ["s1c1", "s2c1"]
    assert [c.call_id for c in eg.list_calls(run_id=run_id)] == ["s2c1", "s1c1"]
    first = eg.get_call("s1c1", run_id=run_id)
    assert first.outcome is not None
    assert (first.outcome.status, first.outcome.evidence.exit_code) == (Status.SUCCESS, 0)
    assert first.replay_of == ""
    finished = first.outcome.mark("finished")
    assert finished is not None
    assert finished.at > killed_at
    assert [a["call_id"] for a in terminal(detail).data["actions"]] == ["s1c1", "s2c1"]


# ---------------------------------------------------------------- resuming from each state


def test_resume_of_an_ended_run_returns_its_record_without_the_model(eg: Client) -> None:
    completed = Loop(eg, S([S.calls(("list_dir", {"path": "."})), S.answer("listed")])).run("a")
    expired = Loop(eg, S([S.calls(("list_dir", {"path": "."}))] * 5), limits={"max_steps": 1})
    ended = [completed, expired.run("b")]
    for original in ended:
        last_seq = eg.runs.get(original.run_id).run.last_seq
        model = S([])
        again = Loop(eg, model).resume(original.run_id)
        assert again == original
        assert model.requests == []
        assert eg.runs.get(original.run_id).run.last_seq == last_seq
    assert [r.state for r in ended] == [State.COMPLETED, State.EXPIRED]
    assert ended[1].rule == "max_steps"


def test_resume_in_validating_sends_the_calls_exactly_once(daemon: Daemon, eg: Client) -> None:
    run_id = "died-validating"
    turn = turn_calling(("run_command", sh("echo once >> validating.txt")))
    before = left_by_a_dead_loop(eg, run_id, turn, sent=False)
    assert eg.runs.get(run_id).calls == ()

    model = S([S.answer("done")])
    result = Loop(eg, model).resume(run_id)
    assert result.state is State.COMPLETED
    assert lines(daemon.workspace / "validating.txt") == ["once"]

    detail = eg.runs.get(run_id)
    assert_continuous(run_id, detail.events)
    assert edges(detail.events)[before.next_seq - 1 :] == [
        ("validating", "running_tools"),
        ("running_tools", "requesting_model"),
        ("requesting_model", "validating"),
        ("validating", "completed"),
    ]
    [call] = detail.calls
    assert (call.call_id, call.idempotency_key) == ("s1c1", f"{run_id}:s1c1")
    assert results_seen(model.requests[0])[0][:2] == ("call_1", False)
    # Resuming again changes nothing: the run has ended.
    assert Loop(eg, S([])).resume(run_id) == result
    assert lines(daemon.workspace / "validating.txt") == ["once"]


def test_resume_sends_a_recorded_call_the_daemon_never_received(daemon: Daemon, eg: Client) -> None:
    run_id = "died-before-sending"
    turn = turn_calling(("run_command", sh("echo once >> unsent.txt")))
    left_by_a_dead_loop(eg, run_id, turn, sent=True)

    result = Loop(eg, S([S.answer("done")])).resume(run_id)
    assert result.state is State.COMPLETED
    assert lines(daemon.workspace / "unsent.txt") == ["once"]
    detail = eg.runs.get(run_id)
    assert_continuous(run_id, detail.events)
    assert [c.call_id for c in detail.calls] == ["s1c1"]
    assert outcome_of(detail, "s1c1").status is Status.SUCCESS


def test_resume_takes_a_finished_calls_outcome_from_the_journal(daemon: Daemon, eg: Client) -> None:
    """The client died after its call ended but before it recorded the batch."""
    run_id = "died-after-the-call"
    script = "echo once >> finished.txt; echo out"
    left_by_a_dead_loop(eg, run_id, turn_calling(("run_command", sh(script))), sent=True)
    [ran] = eg.execute([the_call(run_id, script)], run_id=run_id)
    assert ran.status is Status.SUCCESS

    model = S([S.answer("done")])
    result = Loop(eg, model).resume(run_id)
    assert result.state is State.COMPLETED
    assert lines(daemon.workspace / "finished.txt") == ["once"]
    [(call_id, is_error, content)] = results_seen(model.requests[0])
    assert (call_id, is_error) == ("call_1", False)
    assert "out" in content
    assert [c.call_id for c in eg.runs.get(run_id).calls] == ["s1c1"]


def test_a_call_still_running_at_resume_is_unknown_and_blocks_completion(
    daemon: Daemon, eg: Client
) -> None:
    """reconcile waits `reconcile_wait_s`, then tells the model the effect is unknown; an
    answer is not accepted while a call of the run is still running."""
    run_id = "still-running"
    release = daemon.workspace / "release-still-running"
    script = f"echo once >> running.txt; until [ -e {release.name} ]; do sleep 0.02; done"
    left_by_a_dead_loop(eg, run_id, turn_calling(("run_command", sh(script))), sent=True)
    stream = Streamer(daemon.address, [the_call(run_id, script)], run_id=run_id)
    try:
        wait_until(lambda: lines(daemon.workspace / "running.txt") == ["once"], "the call")

        def release_then_answer(msgs: Sequence[Message]) -> Turn:
            assert "calls still pending: s1c1" in msgs[-1].text
            release.touch()
            wait_until(lambda: not eg.get_call("s1c1", run_id=run_id).running, "the call")
            return S.answer("done now")

        model = S([S.answer("done?"), release_then_answer])
        result = Loop(eg, model, reconcile_wait_s=0.1).resume(run_id)
    finally:
        release.touch()
        stream.join()

    assert (result.state, result.answer) == (State.COMPLETED, "done now")
    [(_, is_error, content)] = results_seen(model.requests[0])
    assert is_error
    assert "unknown_outcome" in content
    assert "the effect is unknown: reconcile" in content
    assert lines(daemon.workspace / "running.txt") == ["once"]
    detail = eg.runs.get(run_id)
    assert_continuous(run_id, detail.events)
    assert [e.data["finding"] for e in detail.events if "finding" in e.data] == [
        "calls still pending: s1c1"
    ]
    assert [c.call_id for c in detail.calls] == ["s1c1"]


class ClientDied(Exception):
    """Stands for the client process dying while it waits for the model."""


def test_a_second_resume_while_a_call_still_runs(daemon: Daemon, eg: Client) -> None:
    run_id = "resumed-twice"
    release = daemon.workspace / "release-resumed-twice"
    script = f"until [ -e {release.name} ]; do sleep 0.02; done"
    left_by_a_dead_loop(eg, run_id, turn_calling(("run_command", sh(script))), sent=True)
    stream = Streamer(daemon.address, [the_call(run_id, script)], run_id=run_id)
    try:
        wait_until(lambda: eg.runs.get(run_id).calls, "the call recorded")

        def die(msgs: Sequence[Message]) -> Turn:
            raise ClientDied

        with pytest.raises(ClientDied):
            Loop(eg, S([die]), reconcile_wait_s=0.1).resume(run_id)
        assert state_of(eg, run_id) is State.REQUESTING_MODEL
        assert eg.get_call("s1c1", run_id=run_id).running

        def release_then_answer(msgs: Sequence[Message]) -> Turn:
            release.touch()
            wait_until(lambda: not eg.get_call("s1c1", run_id=run_id).running, "the call")
            return S.answer("done")

        result = Loop(eg, S([release_then_answer]), reconcile_wait_s=0.1).resume(run_id)
    finally:
        release.touch()
        stream.join()
    assert result.state is State.COMPLETED
    assert [c.call_id for c in eg.runs.get(run_id).calls] == ["s1c1"]


def test_resume_keeps_the_runs_recorded_limits(eg: Client) -> None:
    run_id = "limits-on-record"
    model = S([S.calls(("list_dir", {"path": "."}))] * 10)
    m = Machine(run_id)
    eg.runs.start("list", run_id=run_id, limits={"max_steps": 2})
    eg.runs.append(run_id, [m.advance(State.REQUESTING_MODEL, "run started")])
    assert eg.runs.get(run_id).run.limits == {"max_steps": 2}

    result = Loop(eg, model).resume(run_id)
    assert len(model.requests) == 2
    assert (result.state, result.rule) == (State.EXPIRED, "max_steps")


def test_a_client_killed_while_its_call_awaits_approval(guarded: Daemon, tmp_path: Path) -> None:
    """The daemon drops a parked call whose client went away (it never ran); the resumed
    loop reports that to the model and does not send it again."""
    run_id = "killed-while-parked"
    driver = Driver(tmp_path, PARKING_DRIVER, guarded.address, TOKENS["bot"], run_id)
    with as_(guarded, "alice") as alice, as_(guarded, "bot") as bot:
        try:
            # Parked at the daemon, and the loop has recorded that it waits for it: the
            # approval shows before the client appends its awaiting_approval transition.
            wait_until(
                lambda: (
                    driver.alive()
                    and [a for a in alice.approvals_pending() if a.run_id == run_id]
                    and bot.runs.get(run_id).run.state is State.AWAITING_APPROVAL
                ),
                "the call parked and the run awaiting approval",
            )
        finally:
            driver.kill()
        wait_until(
            lambda: [c for c in bot.runs.get(run_id).calls if c.outcome is not None],
            "the daemon to settle the parked call",
        )
        assert not [a for a in alice.approvals_pending() if a.run_id == run_id]
        assert bot.runs.get(run_id).run.state is State.AWAITING_APPROVAL

        model = S([S.answer("it did not run")])
        result = Loop(bot, model).resume(run_id)
        detail = bot.runs.get(run_id)
        assert not [a for a in alice.approvals_pending() if a.run_id == run_id]

    assert result.state is State.COMPLETED
    assert not (guarded.workspace / "approved.txt").exists()
    [(call_id, is_error, content)] = results_seen(model.requests[0])
    assert (call_id, is_error) == ("call_1", True)
    assert "cancelled" in content
    assert_continuous(run_id, detail.events)
    assert edges(detail.events)[3:6] == [
        ("running_tools", "awaiting_approval"),
        ("awaiting_approval", "running_tools"),
        ("running_tools", "requesting_model"),
    ]
    [call] = detail.calls
    assert call.outcome is not None
    assert (call.outcome.status, call.outcome.mark("started")) == (Status.REJECTED, None)


def test_a_call_parked_across_a_daemon_restart_runs_once_after_resume(tmp_path: Path) -> None:
    """The daemon stops while the loop's call awaits approval: the loop dies with the
    stream; the restarted daemon keeps the approval; a resumed loop finds the call
    there (not in the journal's calls yet) and waits for it instead of re-sending it."""
    daemon = start_auth_daemon(tmp_path, ASK_POLICY)
    run_id = "parked-over-restart"
    tee = ("run_command", {"argv": ["tee", "-a", "approved.txt"], "stdin": "ran\n"})
    try:
        errors: list[BaseException] = []

        def first() -> None:
            with as_(daemon, "bot") as bot:
                try:
                    Loop(bot, ScriptedModel([ScriptedModel.calls(tee)])).run("tee", run_id=run_id)
                except Exception as exc:  # the stream ends with the daemon
                    errors.append(exc)

        loop = threading.Thread(target=first)
        loop.start()
        with as_(daemon, "bot") as bot:
            wait_until(lambda: state_of(bot, run_id) is State.AWAITING_APPROVAL, "parked")
        daemon.stop()
        loop.join(15)
        assert errors, "the first loop should have lost its daemon"
        daemon.restart()

        def resume() -> LoopResult:
            with as_(daemon, "bot") as bot:
                model = ScriptedModel([ScriptedModel.answer("appended once")])
                return Loop(bot, model).resume(run_id)

        resumed = Background(resume)  # reconciling: the call is parked, not in `calls`
        with as_(daemon, "alice") as alice:
            (pending,) = [a for a in alice.approvals_pending() if a.run_id == run_id]
            alice.approve(pending.approval_id, "go")
        result = resumed.result(timeout=30)
        with as_(daemon, "bot") as bot:
            detail = bot.runs.get(run_id)
        assert result.state is State.COMPLETED, result
        assert lines(daemon.workspace / "approved.txt") == ["ran"]
        assert [(c.call_id, c.outcome.status if c.outcome else None) for c in detail.calls] == [
            ("s1c1", Status.SUCCESS)
        ]
        assert_continuous(run_id, detail.events)
    finally:
        stop(daemon)
