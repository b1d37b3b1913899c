"""Runs.Step through a real daemon: a loop step's transitions and its batch in one round
trip, the batch's end recorded by the daemon, a retried step answered without a second
transition or a second run of any call, and a daemon killed at each point of a step
leaving a run that resumes as before.

Commands append a line to a counter file in the workspace (the `process` sandbox), so
"ran twice" is a line too many.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import grpc
import pytest

from execgate.client import (
    Call,
    Client,
    DaemonUnavailable,
    Event,
    EventKind,
    Loop,
    PermissionDenied,
    RunRefused,
    Status,
)
from execgate.client.loop.states import State, Transition
from execgate.client.models.scripted import ScriptedModel
from execgate.client.runs import event_msg
from execgate.v1 import runs_pb2 as rpb
from execgate.v1 import runs_pb2_grpc as rpb_grpc
from tests.daemon import Daemon, scaled
from tests.loop_support import (
    TOKENS,
    Background,
    as_,
    assert_continuous,
    counting,
    edges,
    lines,
    opening,
    sh,
    start_auth_daemon,
    start_daemon,
    stop,
    the_end,
)
from tests.support import wait_until

S = ScriptedModel


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_auth_daemon(tmp_path_factory.mktemp("step"))
    yield d
    stop(d)


@pytest.fixture(scope="module")
def bot(daemon: Daemon) -> Iterator[Client]:
    with as_(daemon, "bot") as c:
        yield c


def step_request(run_id: str, events: list[Transition], calls: list[Call]) -> rpb.StepRequest:
    from execgate.client import wire

    return rpb.StepRequest(
        run_id=run_id,
        events=[event_msg(e) for e in events],
        calls=[wire.tool_call(c) for c in calls],
    )


# ---------------------------------------------------------------- one round trip


def test_a_step_records_its_transitions_its_batch_and_its_end(bot: Client, daemon: Daemon) -> None:
    run_id = "step-once"
    calls = [counting(run_id, "once.txt"), counting(run_id, "once.txt", "s1c2", then="exit 3")]
    m, events = opening(bot, run_id, calls)

    done = bot.runs.step(run_id, events, calls)

    assert [o.status for o in done.outcomes] == [Status.SUCCESS, Status.FAILURE]
    end = the_end(done)
    assert end.seq == 4
    assert end.data == {
        "results": [
            {"call_id": "s1c1", "status": "success", "error_class": "none"},
            {"call_id": "s1c2", "status": "failure", "error_class": "nonzero_exit"},
        ]
    }
    assert (done.run.state, done.run.last_seq) == (State.REQUESTING_MODEL, 4)
    detail = bot.runs.get(run_id)
    assert_continuous(run_id, detail.events)
    assert detail.events[-1] == end
    assert [e.data for e in detail.events[1:3]] == [e.data for e in events]
    assert lines(daemon.workspace / "once.txt") == ["s1c1", "s1c2"]
    m.record(end)  # the loop's machine takes the daemon's move as its own


def test_the_streamed_step_sends_the_batch_then_its_end_then_the_run(bot: Client) -> None:
    run_id = "step-streamed"
    calls = [counting(run_id, "streamed.txt")]
    _, events = opening(bot, run_id, calls)
    seen: list[str] = []
    with grpc.insecure_channel(bot.address) as channel:
        stub = rpb_grpc.RunsStub(channel)
        auth = (("authorization", f"Bearer {TOKENS['bot']}"),)
        for update in stub.Step(step_request(run_id, events, calls), metadata=auth):
            kind = update.WhichOneof("update")
            seen.append(kind if kind != "call" else update.call.WhichOneof("kind"))
    assert seen == ["queued", "started", "finished", "event", "run"]


def test_the_client_hands_each_batch_event_to_on_event(bot: Client) -> None:
    run_id = "step-on-event"
    calls = [counting(run_id, "events.txt")]
    _, events = opening(bot, run_id, calls)
    got: list[Event] = []
    done = bot.runs.step(run_id, events, calls, on_event=got.append)
    assert [e.kind for e in got] == [EventKind.QUEUED, EventKind.STARTED, EventKind.FINISHED]
    assert done.outcomes[0] == got[-1].outcome
    assert the_end(done).seq == 4


def test_each_tool_batch_of_a_loop_is_one_step_rpc(daemon: Daemon) -> None:
    """No append or Execute around a batch: the loop's transitions into and out of
    running_tools travel with it. (The real methods run; they are only counted.)"""
    with as_(daemon, "bot") as c:
        counted = {
            name: mock.patch.object(owner, name, wraps=getattr(owner, name))
            for owner, name in ((c.runs, "step"), (c.runs, "append"), (c, "stream"), (c, "execute"))
        }
        spies = {name: patcher.start() for name, patcher in counted.items()}
        try:
            model = S(
                [
                    S.calls(("list_dir", {"path": "."})),
                    S.calls(("list_dir", {"path": "."}), ("read_file", {"path": "none.txt"})),
                    S.answer("looked"),
                ]
            )
            result = Loop(c, model).run("look around")
        finally:
            mock.patch.stopall()
    assert result.state is State.COMPLETED, result
    # Two steps; appends: the start, and the final answer's two moves.
    assert {name: spy.call_count for name, spy in spies.items()} == {
        "step": 2,
        "append": 3,
        "stream": 0,
        "execute": 0,
    }


# ---------------------------------------------------------------- a retried step


def test_a_retried_step_is_answered_the_same_and_nothing_happens_twice(
    bot: Client, daemon: Daemon
) -> None:
    run_id = "step-retried"
    calls = [counting(run_id, "retried.txt")]
    _, events = opening(bot, run_id, calls)
    first = bot.runs.step(run_id, events, calls)

    again = bot.runs.step(run_id, events, calls)  # the answer was lost: the client retries

    assert [(e.seq, e.reason, e.data) for e in again.events] == [
        (e.seq, e.reason, e.data) for e in first.events
    ]
    assert [(o.status, o.error_class) for o in again.outcomes] == [(Status.SUCCESS, "none")]
    assert again.run.last_seq == first.run.last_seq == 4
    detail = bot.runs.get(run_id)
    assert len(detail.events) == 4
    assert_continuous(run_id, detail.events)
    assert [c.call_id for c in detail.calls] == ["s1c1"]
    assert lines(daemon.workspace / "retried.txt") == ["s1c1"]


def test_a_retry_racing_the_original_step_ends_it_once(bot: Client, daemon: Daemon) -> None:
    """The retry arrives while the original still runs its call: it joins the call, and
    both answers carry the one end the daemon recorded."""
    run_id = "step-raced"
    calls = [counting(run_id, "raced.txt", then="sleep 2")]
    _, events = opening(bot, run_id, calls)
    original = Background(lambda: bot.runs.step(run_id, events, calls))
    wait_until(lambda: lines(daemon.workspace / "raced.txt"), "the original's call to run")
    with as_(daemon, "bot") as other:
        assert not original.done
        retried = other.runs.step(run_id, events, calls)
    first = original.result(timeout=scaled(15))
    assert [o.status for o in (*first.outcomes, *retried.outcomes)] == [Status.SUCCESS] * 2
    assert the_end(retried) == the_end(first)
    detail = bot.runs.get(run_id)
    assert edges(detail.events)[-1] == ("running_tools", "requesting_model")
    assert len(detail.events) == 4
    assert lines(daemon.workspace / "raced.txt") == ["s1c1"]


def test_a_different_step_at_a_recorded_seq_is_refused_and_runs_nothing(
    bot: Client, daemon: Daemon
) -> None:
    run_id = "step-conflict"
    calls = [counting(run_id, "conflict.txt")]
    _, events = opening(bot, run_id, calls)
    bot.runs.step(run_id, events, calls)
    other = [events[0], dataclasses.replace(events[1], data={"calls": []})]
    with pytest.raises(RunRefused, match="duplicate"):
        bot.runs.step(run_id, other, [counting(run_id, "conflict.txt", "s1c9")])
    assert len(bot.runs.get(run_id).events) == 4
    assert lines(daemon.workspace / "conflict.txt") == ["s1c1"]


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("broken", "field"),
    [
        ("no_key", "calls[0].idempotency_key"),
        ("no_call_id", "calls[0].call_id"),
        ("no_calls", "calls"),
        ("no_events", "events"),
    ],
)
def test_a_step_names_its_calls_and_opens_with_transitions(
    bot: Client, broken: str, field: str
) -> None:
    run_id = f"step-malformed-{broken}"
    calls = [counting(run_id, "never.txt")]
    _, events = opening(bot, run_id, calls)
    match broken:
        case "no_key":
            calls = [Call(tool="noop", arguments={}, call_id="s1c1")]
        case "no_call_id":
            calls = [Call(tool="noop", arguments={}, idempotency_key="k")]
        case "no_calls":
            calls = []
        case "no_events":
            events = []
    with pytest.raises(RunRefused) as refused:
        bot.runs.step(run_id, events, calls)
    assert refused.value.kind == "missing"
    assert field in refused.value.details
    assert bot.runs.get(run_id).run.last_seq == 1


def test_a_step_that_does_not_enter_running_tools_is_refused(bot: Client) -> None:
    run_id = "step-no-tools"
    calls = [counting(run_id, "never.txt")]
    _, events = opening(bot, run_id, calls)
    with pytest.raises(RunRefused) as refused:
        bot.runs.step(run_id, events[:1], calls)
    assert refused.value.kind == "malformed"
    assert "running_tools" in refused.value.details
    assert bot.runs.get(run_id).run.last_seq == 1
    assert bot.runs.get(run_id).calls == ()


def test_only_the_owner_steps_its_run(bot: Client, daemon: Daemon) -> None:
    run_id = "step-owned"
    calls = [counting(run_id, "owned.txt")]
    _, events = opening(bot, run_id, calls)
    with as_(daemon, "bob") as bob, pytest.raises(PermissionDenied):
        bob.runs.step(run_id, events, calls)
    assert bot.runs.get(run_id).run.last_seq == 1
    assert not (daemon.workspace / "owned.txt").exists()


# ---------------------------------------------------------------- a daemon killed mid-step

HOLDER = Call(tool="run_command", arguments={"argv": ["sh", "-c", "sleep 60"]})


def test_a_daemon_killed_after_the_opening_before_the_calls_ran(tmp_path: Path) -> None:
    """The opening is recorded, the call waits for a lock held by another run's command
    (so it has no journal row), the daemon dies: the resumed loop finds the call never
    received and sends it, once."""
    daemon = start_daemon(tmp_path / "d")
    run_id = "killed-before-calls"
    try:
        with Client(daemon.address) as c:
            holder = Background(lambda: c.execute([HOLDER], run_id="holder"))
            wait_until(lambda: [r for r in c.list_calls(run_id="holder") if r.running], "held")
            waiting = threading.Event()

            def saw(event: Event) -> None:
                if event.kind is EventKind.WAITING:
                    waiting.set()

            model = S([S.calls(("run_command", sh("echo ran >> counter.txt"))), S.answer("x")])
            first = Background(lambda: Loop(c, model, on_event=saw).run("count", run_id=run_id))
            assert waiting.wait(scaled(15)), "the loop's call should wait for the lock"
            assert c.runs.get(run_id).run.state is State.RUNNING_TOOLS
            assert c.runs.get(run_id).calls == ()
            daemon.kill()
        with pytest.raises(DaemonUnavailable):
            first.result(timeout=scaled(15))
        with pytest.raises(DaemonUnavailable):  # its daemon died under it too
            holder.result(timeout=scaled(15))
        daemon.restart()
        with Client(daemon.address) as c:
            result = Loop(c, S([S.answer("counted once")])).resume(run_id)
            detail = c.runs.get(run_id)
        assert result.state is State.COMPLETED, result
        assert lines(daemon.workspace / "counter.txt") == ["ran"]
        assert_continuous(run_id, detail.events)
        assert edges(detail.events) == [
            ("created", "requesting_model"),
            ("requesting_model", "validating"),
            ("validating", "running_tools"),
            ("running_tools", "requesting_model"),
            ("requesting_model", "validating"),
            ("validating", "completed"),
        ]
        [call] = detail.calls
        assert call.outcome is not None
        assert (call.call_id, call.outcome.status) == ("s1c1", Status.SUCCESS)
    finally:
        stop(daemon)


def test_a_step_is_recorded_once_it_answers_even_if_the_daemon_dies_at_once(
    tmp_path: Path,
) -> None:
    daemon = start_daemon(tmp_path / "d")
    run_id = "killed-after-step"
    try:
        with Client(daemon.address) as c:
            calls = [counting(run_id, "after.txt")]
            _, events = opening(c, run_id, calls)
            done = c.runs.step(run_id, events, calls)
            daemon.kill()
        daemon.restart()
        with Client(daemon.address) as c:
            detail = c.runs.get(run_id)
        assert detail.events[-1] == the_end(done)
        assert [(r.call_id, r.outcome.status if r.outcome else None) for r in detail.calls] == [
            ("s1c1", Status.SUCCESS)
        ]
    finally:
        stop(daemon)


def test_a_daemon_killed_while_the_steps_call_runs(tmp_path: Path) -> None:
    """The call was running (its intent recorded): the restarted daemon settles it as
    interrupted; the resumed loop takes that from the journal, runs nothing again, and
    records the batch's end itself."""
    daemon = start_daemon(tmp_path / "d")
    run_id = "killed-mid-call"
    try:
        with Client(daemon.address) as c:
            model = S([S.calls(("run_command", sh("echo ran >> mid.txt; sleep 60")))])
            first = Background(lambda: Loop(c, model).run("count", run_id=run_id))
            wait_until(lambda: lines(daemon.workspace / "mid.txt"), "the call to run")
            daemon.kill()
        with pytest.raises(DaemonUnavailable):
            first.result(timeout=scaled(15))
        daemon.restart()
        with Client(daemon.address) as c:
            model = S([S.answer("it was interrupted")])
            result = Loop(c, model).resume(run_id)
            detail = c.runs.get(run_id)
        assert result.state is State.COMPLETED, result
        assert lines(daemon.workspace / "mid.txt") == ["ran"]
        assert_continuous(run_id, detail.events)
        end = detail.events[3]
        assert (end.reason, end.data["results"]) == (
            "batch finished",
            [{"call_id": "s1c1", "status": "unknown_outcome", "error_class": "interrupted"}],
        )
    finally:
        stop(daemon)
