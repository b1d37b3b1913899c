"""The client `Loop` end to end: a `ScriptedModel` drives a real daemon, and every test
checks both what the loop returned (`LoopResult`) and what the daemon recorded
(`client.runs.get(run_id)`: the transitions and the run's calls).

Two daemons: `plain` (no identities; every caller is `local`) for most scenarios, and
`guarded` (identities and an `ask` policy, tests/loop_support.py) for cancels by an
operator, approvals and policy denials.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import pytest

from execgate.client import Client, Loop, LoopResult, PermissionDenied, SoFar, Status, Verdict
from execgate.client.loop.observe import DAEMON_HINTS, REFUSAL_HINTS, Refusal
from execgate.client.loop.states import State
from execgate.client.models.base import Message, ToolCall, Turn, Usage
from execgate.client.models.scripted import ScriptedModel
from tests.daemon import Daemon, give
from tests.loop_support import (
    ASK_POLICY,
    Background,
    as_,
    assert_continuous,
    edges,
    interval,
    lines,
    outcome_of,
    processes,
    start_auth_daemon,
    start_daemon,
    state_of,
    stop,
    terminal,
)
from tests.support import wait_until

S = ScriptedModel


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("loop-plain"))
    (d.workspace / "a.txt").write_text("alpha\n")
    (d.workspace / "b.txt").write_text("beta\n")
    yield d
    stop(d)


@pytest.fixture(scope="module")
def eg(plain: Daemon) -> Iterator[Client]:
    with Client(plain.address) as c:
        yield c


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_auth_daemon(tmp_path_factory.mktemp("loop-guarded"), ASK_POLICY)
    yield d
    stop(d)


def repeat(turn: Turn, n: int = 20) -> list[Turn]:
    return [turn] * n


def last_results(request: Sequence[Message]) -> Message:
    """The tool_results message a model request ends with."""
    message = request[-1]
    assert message.role == "tool_results", request
    return message


# ---------------------------------------------------------------- the two issue scenarios


def test_scenario_1_two_tools_then_an_answer_completes(eg: Client) -> None:
    model = S(
        [
            S.calls(("read_file", {"path": "a.txt"})),
            S.calls(("read_file", {"path": "b.txt"})),
            lambda msgs: S.answer("a and b say " + " ".join(r.content for r in msgs[-1].results)),
        ]
    )
    result = Loop(eg, model).run("read a.txt and b.txt")

    assert result.state is State.COMPLETED
    assert result.completed
    assert result.figures["steps"] == 3
    assert "beta" in result.answer
    assert result.rule == ""
    assert model.remaining == 0

    detail = eg.runs.get(result.run_id)
    assert_continuous(result.run_id, detail.events)
    assert edges(detail.events) == [
        ("created", "requesting_model"),
        ("requesting_model", "validating"),
        ("validating", "running_tools"),
        ("running_tools", "requesting_model"),
        ("requesting_model", "validating"),
        ("validating", "running_tools"),
        ("running_tools", "requesting_model"),
        ("requesting_model", "validating"),
        ("validating", "completed"),
    ]
    done = terminal(detail)
    assert done.data["answer"] == result.answer
    assert [(a["call_id"], a["tool"], a["status"]) for a in done.data["actions"]] == [
        ("s1c1", "read_file", "success"),
        ("s2c1", "read_file", "success"),
    ]
    assert done.data["figures"]["steps"] == 3
    assert [(c.call_id, c.tool) for c in detail.calls] == [
        ("s1c1", "read_file"),
        ("s2c1", "read_file"),
    ]
    assert outcome_of(detail, "s2c1").text == "beta\n"
    assert detail.run.model == "scripted"
    assert detail.run.labels == {"client": "python"}


def test_scenario_2_a_model_that_repeats_itself_expires_at_max_steps(eg: Client) -> None:
    model = S(repeat(S.calls(("list_dir", {"path": "."}))))
    result = Loop(eg, model, limits={"max_steps": 2}).run("list forever")

    assert (result.state, result.rule) == (State.EXPIRED, "max_steps")
    assert result.figures["steps"] == 2
    assert result.evidence == {"limit": 2, "steps": 2}
    # Two model requests, not one more: no endless loop, no crash.
    assert model.remaining == 18
    assert len(model.requests) == 2

    detail = eg.runs.get(result.run_id)
    assert_continuous(result.run_id, detail.events)
    end = terminal(detail)
    assert (end.from_state, end.to_state) == (State.REQUESTING_MODEL, State.EXPIRED)
    assert end.data["rule"] == "max_steps"
    assert detail.run.limits["max_steps"] == 2
    assert [c.call_id for c in detail.calls] == ["s1c1", "s2c1"]


# ---------------------------------------------------------------- repeated failure


def test_repeated_failure_fails_at_the_consecutive_error_threshold(eg: Client) -> None:
    model = S(repeat(S.calls(("read_file", {"path": "no/such/file.txt"}))))
    loop = Loop(eg, model, limits={"max_consecutive_errors": 3, "max_repeats": 10})
    result = loop.run("read a file that is not there")

    assert (result.state, result.rule) == (State.FAILED, "max_consecutive_errors")
    assert result.evidence["count"] == 3
    assert result.figures["failures"] == 3
    assert "no/such/file.txt" in result.evidence["last_action"]
    assert result.evidence["last_result"] == "failure/not_found"

    detail = eg.runs.get(result.run_id)
    end = terminal(detail)
    assert end.data["evidence"]["count"] == 3
    assert [c.outcome.error_class for c in detail.calls if c.outcome] == ["not_found"] * 3
    assert len(model.requests) == 3


def test_repeated_failure_escalates_as_no_progress(eg: Client) -> None:
    model = S(repeat(S.calls(("read_file", {"path": "no/such/file.txt"}))))
    loop = Loop(eg, model, limits={"max_consecutive_errors": 10, "max_repeats": 2})
    result = loop.run("read a file that is not there")

    assert (result.state, result.rule) == (State.ESCALATED, "no_progress")
    # The same call, the same result: seen 3 times, 2 allowed.
    assert result.evidence["count"] == 3
    assert result.evidence["limit"] == 2
    assert result.evidence["tool"] == "read_file"
    assert result.evidence["arguments"] == '{"path":"no/such/file.txt"}'

    detail = eg.runs.get(result.run_id)
    end = terminal(detail)
    assert end.to_state is State.ESCALATED
    assert end.data["evidence"]["count"] == 3
    assert len(detail.calls) == 3


# ---------------------------------------------------------------- one turn, one file


def test_two_calls_of_one_turn_writing_one_file_do_not_overlap(plain: Daemon, eg: Client) -> None:
    (plain.workspace / "counter").write_text("0\n")
    give(plain.workspace / "counter")  # the commands run as the workspace's owner
    model = S(
        [
            S.calls(
                ("work", {"path": "counter", "write": True, "seconds": 0.3}),
                ("work", {"path": "counter", "write": True, "seconds": 0.3}),
                ("write_file", {"path": "same.txt", "content": "first"}),
                ("write_file", {"path": "same.txt", "content": "second"}),
            ),
            S.answer("done"),
        ]
    )
    result = Loop(eg, model).run("write twice")
    assert result.state is State.COMPLETED

    detail = eg.runs.get(result.run_id)
    for first, second in (("s1c1", "s1c2"), ("s1c3", "s1c4")):
        a, b = outcome_of(detail, first), outcome_of(detail, second)
        assert a.status is b.status is Status.SUCCESS
        assert b.mark("waiting") is not None, b.timeline
        (a_start, a_end), (b_start, b_end) = interval(a), interval(b)
        assert a_end <= b_start or b_end <= a_start, (interval(a), interval(b))
    # Run one after the other, two increments are two (no lost update), and the later
    # write is the one that stays.
    assert (plain.workspace / "counter").read_text().strip() == "2"
    assert (plain.workspace / "same.txt").read_text() == "second"


# ---------------------------------------------------------------- the other terminal states


@pytest.mark.parametrize(
    ("limits", "usage", "rule", "steps"),
    [
        ({"max_tokens": 250}, Usage(100, 50), "max_tokens", 2),
        ({"max_cost": 1.0}, Usage(100, 50, cost=0.4), "max_cost", 3),
    ],
    ids=["tokens", "cost"],
)
def test_budget_exhausted_records_what_was_spent_and_how_far_it_got(
    eg: Client, limits: dict[str, float], usage: Usage, rule: str, steps: int
) -> None:
    model = S(repeat(S.calls(("list_dir", {"path": "."}), usage=usage)))
    result = Loop(eg, model, limits=limits).run("spend")

    assert (result.state, result.rule) == (State.BUDGET_EXHAUSTED, rule)
    assert result.figures["steps"] == steps
    assert result.figures["tokens"] == 150 * steps
    assert result.figures["cost"] == pytest.approx(usage.cost * steps)
    assert len(model.requests) == steps

    detail = eg.runs.get(result.run_id)
    end = terminal(detail)
    assert end.data["rule"] == rule
    assert end.data["figures"]["tokens"] == 150 * steps
    assert end.data["figures"]["cost"] == pytest.approx(usage.cost * steps)
    # The turn that crossed the budget proposed a call; it was never sent.
    [unrun] = end.data["not_run"]
    assert unrun == {"name": "list_dir", "arguments": {"path": "."}}
    assert len(detail.calls) == steps - 1
    assert f"s{steps}c1" not in {c.call_id for c in detail.calls}


def test_deadline_expires_a_run_stuck_in_a_slow_command(plain: Daemon, eg: Client) -> None:
    model = S(repeat(S.calls(("run_command", {"argv": ["sleep", "31"]}))))
    began = time.monotonic()
    result = Loop(eg, model, limits={"deadline_seconds": 1.0}).run("wait a long time")
    took = time.monotonic() - began

    assert (result.state, result.rule) == (State.EXPIRED, "deadline")
    assert 1.0 <= result.figures["elapsed_s"] < 10
    assert took < 10
    assert result.evidence["limit_s"] == 1.0
    assert result.evidence["elapsed_s"] >= 1.0
    assert len(model.requests) == 1

    detail = eg.runs.get(result.run_id)
    end = terminal(detail)
    assert "run_command" in end.data["last_action"]
    assert "sleep" in end.data["last_action"]
    # The daemon stopped the command at the deadline (the run's, passed with the batch).
    stopped = outcome_of(detail, "s1c1")
    assert stopped.error_class == "timeout"
    assert stopped.mark("stopped") is not None
    assert not processes(["sleep", "31"], plain.workspace)


def test_a_model_that_fails_ends_the_run_failed(eg: Client) -> None:
    model = S([S.calls(("list_dir", {"path": "."}))])  # then the script runs out
    result = Loop(eg, model).run("talk until the script ends")
    assert (result.state, result.rule) == (State.FAILED, "model_error")
    detail = eg.runs.get(result.run_id)
    end = terminal(detail)
    assert "script" in end.data["error"].lower() or "turn" in end.data["error"].lower()
    assert end.data["figures"]["steps"] == 1
    assert "list_dir" in end.data["last_action"]


# ---------------------------------------------------------------- cancellation


def test_cancel_while_a_tool_runs_ends_the_loop_cancelled(guarded: Daemon) -> None:
    model = S([S.calls(("run_command", {"argv": ["sleep", "30"]})), S.answer("never")])
    run_id = "cancel-while-sleeping"

    def run() -> LoopResult:
        with as_(guarded, "bot") as bot:
            return Loop(bot, model).run("sleep", run_id=run_id)

    loop = Background(run)
    wait_until(lambda: processes(["sleep", "30"], guarded.workspace), "the call sleeping")
    with as_(guarded, "bob") as bob, as_(guarded, "olga") as olga:
        assert olga.runs.get(run_id).run.state is State.RUNNING_TOOLS
        with pytest.raises(PermissionDenied):
            bob.runs.cancel(run_id, reason="not my run")
        assert olga.runs.get(run_id).run.cancel is None
        asked = time.monotonic()
        olga.runs.cancel(run_id, reason="wrong branch")
        result = loop.result(timeout=10)
        took = time.monotonic() - asked
        detail = olga.runs.get(run_id)

    assert took < 5
    assert (result.state, result.rule) == (State.CANCELLED, "cancelled")
    assert "olga" in result.reason
    assert "wrong branch" in result.reason
    # The loop did not ask the model again once the run was cancelled.
    assert len(model.requests) == 1
    assert not processes(["sleep", "30"], guarded.workspace)

    assert_continuous(run_id, detail.events)
    end = terminal(detail)
    assert end.to_state is State.CANCELLED
    cancel = detail.run.cancel
    assert cancel is not None
    assert end.data["evidence"]["who"] == "olga"
    assert end.data["evidence"]["requested_at"] == pytest.approx(cancel.at)
    [stopped] = end.data["stopped_calls"]
    assert (stopped["call_id"], stopped["tool"]) == ("s1c1", "run_command")
    assert stopped["cancel_requested_at"] == pytest.approx(cancel.at, abs=1e-3)
    assert stopped["stopped_at"] is not None
    assert stopped["stopped_at"] >= stopped["cancel_requested_at"]
    assert end.data["rolled_back"] is False
    assert "sleep" in end.data["last_action"]
    assert outcome_of(detail, "s1c1").error_class == "cancelled"


def test_a_cancel_during_the_model_request_wins_over_its_final_answer(eg: Client) -> None:
    run_id = "cancel-before-answer"

    def cancel_then_answer(msgs: Sequence[Message]) -> Turn:
        eg.runs.cancel(run_id, reason="stop now")
        return S.answer("finished anyway")

    result = Loop(eg, S([cancel_then_answer])).run("answer", run_id=run_id)
    detail = eg.runs.get(run_id)
    assert detail.run.cancel is not None
    assert terminal(detail).to_state is State.CANCELLED
    assert result.state is State.CANCELLED


def test_a_cancel_while_the_answer_is_verified_still_wins(eg: Client) -> None:
    """The cancel lands after the loop's last append (it reads no cancel), while the
    verifier runs: the daemon refuses `completed`, and the loop ends the run cancelled."""
    run_id = "cancel-during-verify"

    def verifier(so_far: SoFar) -> Verdict:
        eg.runs.cancel(run_id, reason="changed my mind")
        return Verdict(True)

    result = Loop(eg, S([S.answer("done")]), verifier=verifier).run("answer", run_id=run_id)
    assert (result.state, result.rule) == (State.CANCELLED, "cancelled")
    detail = eg.runs.get(run_id)
    assert terminal(detail).to_state is State.CANCELLED
    assert edges(detail.events)[-1] == ("validating", "cancelled")
    assert_continuous(run_id, detail.events)
    # Resuming the ended run reads its record; nothing is asked again.
    again = Loop(eg, S([])).resume(run_id)
    assert again.state is State.CANCELLED


# ---------------------------------------------------------------- the verifier


def test_a_rejected_answer_goes_back_to_the_model_and_the_run_goes_on(eg: Client) -> None:
    seen: list[SoFar] = []

    def verifier(so_far: SoFar) -> Verdict:
        seen.append(so_far)
        if "alpha" not in so_far.answer:
            return Verdict(False, "the answer must quote a.txt")
        return Verdict(True)

    model = S(
        [
            S.calls(("read_file", {"path": "a.txt"})),
            S.answer("I read it"),
            S.answer("it says alpha"),
        ]
    )
    result = Loop(eg, model, verifier=verifier).run("quote a.txt")

    assert result.state is State.COMPLETED
    assert result.answer == "it says alpha"
    assert result.figures["steps"] == 3
    # The finding is the last thing the model saw before its second answer.
    finding = model.requests[2][-1]
    assert finding.role == "user"
    assert "the answer must quote a.txt" in finding.text
    # The verifier saw the goal, the proposal and every call that ran.
    assert [s.answer for s in seen] == ["I read it", "it says alpha"]
    assert seen[0].goal == "quote a.txt"
    [(tool, args, outcome)] = seen[0].calls
    assert (tool, args, outcome.status) == ("read_file", {"path": "a.txt"}, Status.SUCCESS)

    detail = eg.runs.get(result.run_id)
    rejected = [e for e in detail.events if "finding" in e.data]
    assert [(e.from_state, e.to_state) for e in rejected] == [
        (State.VALIDATING, State.REQUESTING_MODEL)
    ]
    assert rejected[0].data["finding"] == "the answer must quote a.txt"
    assert terminal(detail).data["answer"] == "it says alpha"


def test_a_rejected_answer_fails_the_run_when_asked_to(eg: Client) -> None:
    model = S([S.answer("I did not look"), S.answer("never asked")])
    result = Loop(
        eg,
        model,
        verifier=lambda so_far: Verdict(False, "no file was read"),
        on_rejected_answer="fail",
    ).run("quote a.txt")

    assert (result.state, result.rule) == (State.FAILED, "verifier")
    assert result.reason == "no file was read"
    assert len(model.requests) == 1
    end = terminal(eg.runs.get(result.run_id))
    assert (end.from_state, end.to_state) == (State.VALIDATING, State.FAILED)
    assert end.reason == "no file was read"
    assert end.data["answer"] == "I did not look"


def test_an_accepted_answer_completes(eg: Client) -> None:
    verdicts: list[str] = []

    def accept(so_far: SoFar) -> Verdict:
        verdicts.append(so_far.answer)
        return Verdict(True)

    result = Loop(eg, S([S.answer("42")]), verifier=accept).run("answer")
    assert (result.state, result.answer) == (State.COMPLETED, "42")
    assert verdicts == ["42"]
    assert terminal(eg.runs.get(result.run_id)).data["answer"] == "42"


# ---------------------------------------------------------------- one turn's results


def test_the_results_of_one_turn_go_back_together_in_the_models_order(eg: Client) -> None:
    model = S(
        [
            S.calls(
                ("read_file", {"path": "a.txt"}),
                ("run_command", {"argv": ["touch", "not-offered.txt"]}),
                ("read_file", {"path": "missing.txt"}),
            ),
            S.answer("done"),
        ]
    )
    result = Loop(eg, model, tools=["read_file", "list_dir"]).run("three calls")
    assert result.state is State.COMPLETED
    assert {t.name for t in model.tools_offered[0]} == {"read_file", "list_dir"}

    tool_results = [m for m in model.requests[1] if m.role == "tool_results"]
    assert len(tool_results) == 1
    got = tool_results[0].results
    assert [r.call_id for r in got] == ["call_1", "call_2", "call_3"]
    assert [r.is_error for r in got] == [False, True, True]
    assert "alpha" in got[0].content
    assert Refusal.TOOL_NOT_OFFERED.value in got[1].content
    assert REFUSAL_HINTS[Refusal.TOOL_NOT_OFFERED] in got[1].content
    assert DAEMON_HINTS["not_found"] in got[2].content
    assert model.requests[1][-1] is tool_results[0]

    # The refused call never reached the daemon; the record says why.
    detail = eg.runs.get(result.run_id)
    assert [c.call_id for c in detail.calls] == ["s1c1", "s1c3"]
    sent = next(e for e in detail.events if e.to_state is State.RUNNING_TOOLS)
    [refused] = sent.data["refused"]
    assert (refused["model_id"], refused["tool"], refused["error_class"]) == (
        "call_2",
        "run_command",
        "tool_not_offered",
    )


def test_a_turn_whose_calls_are_all_refused_goes_back_to_the_model(eg: Client) -> None:
    model = S([S.calls(("run_command", {"argv": ["true"]})), S.answer("gave up")])
    result = Loop(eg, model, tools=["read_file"]).run("run something")
    assert result.state is State.COMPLETED
    [refused] = last_results(model.requests[1]).results
    assert refused.is_error
    assert REFUSAL_HINTS[Refusal.TOOL_NOT_OFFERED] in refused.content
    detail = eg.runs.get(result.run_id)
    assert detail.calls == ()
    assert ("validating", "running_tools") not in edges(detail.events)
    back = detail.events[2]
    assert (back.from_state, back.to_state) == (State.VALIDATING, State.REQUESTING_MODEL)
    assert [r["error_class"] for r in back.data["refused"]] == ["tool_not_offered"]
    assert result.figures["failures"] == 1


def test_two_calls_with_the_same_model_id_each_get_their_own_result(eg: Client) -> None:
    both = Turn(
        "",
        (
            ToolCall("dup", "read_file", {"path": "a.txt"}),
            ToolCall("dup", "read_file", {"path": "b.txt"}),
        ),
        Usage(),
        "tool_calls",
    )
    model = S([both, S.answer("done")])
    result = Loop(eg, model).run("read both")
    got = last_results(model.requests[1]).results
    assert len(got) == 2
    assert "beta" not in got[0].content
    actions = terminal(eg.runs.get(result.run_id)).data["actions"]
    assert len({a["call_id"] for a in actions}) == len(actions)


def test_policy_denied_and_not_offered_calls_get_their_hints(guarded: Daemon) -> None:
    model = S(
        [
            S.calls(
                ("run_command", {"argv": ["ls"]}),  # no rule allows it: default deny
                ("list_dir", {"path": "."}),
                ("sql", {"database": "x.db", "query": "select 1"}),  # not offered
            ),
            S.answer("done"),
        ]
    )
    with as_(guarded, "bot") as bot:
        result = Loop(bot, model, tools=["run_command", "list_dir"]).run("mixed")
        detail = bot.runs.get(result.run_id)
    assert result.state is State.COMPLETED
    got = last_results(model.requests[1]).results
    assert [r.is_error for r in got] == [True, False, True]
    assert "policy_denied" in got[0].content
    assert DAEMON_HINTS["policy_denied"] in got[0].content
    assert REFUSAL_HINTS[Refusal.TOOL_NOT_OFFERED] in got[2].content
    denied = outcome_of(detail, "s1c1")
    assert (denied.status, denied.error_class) == (Status.REJECTED, "policy_denied")


# ---------------------------------------------------------------- approvals


def _approval_loop(
    guarded: Daemon, run_id: str, name: str
) -> tuple[Background[LoopResult], ScriptedModel]:
    model = S([S.calls(("run_command", {"argv": ["touch", name]})), S.answer("touched")])

    def run() -> LoopResult:
        with as_(guarded, "bot") as bot:
            return Loop(bot, model).run("touch a file", run_id=run_id)

    return Background(run), model


def _parked(guarded: Daemon, run_id: str) -> str:
    """Wait until the run's call is parked; the approval's id."""
    with as_(guarded, "alice") as alice, as_(guarded, "olga") as olga:
        wait_until(
            lambda: state_of(olga, run_id) is State.AWAITING_APPROVAL,
            "the run awaiting approval",
        )
        [approval] = [a for a in alice.approvals_pending() if a.run_id == run_id]
    return str(approval.approval_id)


def test_a_parked_call_moves_the_run_to_awaiting_approval_and_back(guarded: Daemon) -> None:
    run_id = "approved-run"
    loop, model = _approval_loop(guarded, run_id, "approved.txt")
    approval_id = _parked(guarded, run_id)
    assert not (guarded.workspace / "approved.txt").exists()
    with as_(guarded, "alice") as alice:
        alice.approve(approval_id, "fine")
    result = loop.result()

    assert result.state is State.COMPLETED
    assert (guarded.workspace / "approved.txt").exists()
    with as_(guarded, "bot") as bot:
        detail = bot.runs.get(run_id)
    assert_continuous(run_id, detail.events)
    assert edges(detail.events) == [
        ("created", "requesting_model"),
        ("requesting_model", "validating"),
        ("validating", "running_tools"),
        ("running_tools", "awaiting_approval"),
        ("awaiting_approval", "running_tools"),
        ("running_tools", "requesting_model"),
        ("requesting_model", "validating"),
        ("validating", "completed"),
    ]
    parked = detail.events[3]
    assert parked.data == {"call_id": "s1c1", "approval_id": approval_id}
    assert "touches" in parked.reason
    assert outcome_of(detail, "s1c1").status is Status.SUCCESS
    assert last_results(model.requests[1]).results[0].is_error is False


def test_a_denied_call_goes_back_with_its_hint(guarded: Daemon) -> None:
    run_id = "denied-run"
    loop, model = _approval_loop(guarded, run_id, "denied.txt")
    approval_id = _parked(guarded, run_id)
    with as_(guarded, "alice") as alice:
        alice.deny(approval_id, "not today")
    result = loop.result()

    assert result.state is State.COMPLETED
    assert not (guarded.workspace / "denied.txt").exists()
    [denied] = last_results(model.requests[1]).results
    assert denied.is_error
    assert DAEMON_HINTS["approval_denied"] in denied.content
    assert "not today" in denied.content
    with as_(guarded, "bot") as bot:
        detail = bot.runs.get(run_id)
    assert ("running_tools", "awaiting_approval") in edges(detail.events)
    assert_continuous(run_id, detail.events)
    assert lines(guarded.workspace / "denied.txt") == []


def test_the_run_stays_awaiting_approval_while_another_call_of_the_batch_runs(
    guarded: Daemon,
) -> None:
    run_id = "approval-and-another-call"
    release = guarded.workspace / "release-approval"
    model = S(
        [
            S.calls(
                (
                    "run_command",
                    {"argv": ["sh", "-c", f"until [ -e {release.name} ]; do sleep 0.02; done"]},
                ),
                ("run_command", {"argv": ["touch", "parked.txt"]}),
            ),
            S.answer("done"),
        ]
    )

    def run() -> LoopResult:
        with as_(guarded, "bot") as bot:
            return Loop(bot, model).run("two calls, one parked", run_id=run_id)

    loop = Background(run)
    try:
        with as_(guarded, "alice") as alice, as_(guarded, "olga") as olga:

            def parked() -> list[str]:
                return [a.approval_id for a in alice.approvals_pending() if a.run_id == run_id]

            wait_until(parked, "the second call parked")
            release.touch()
            wait_until(
                lambda: any(c.outcome for c in olga.runs.get(run_id).calls if c.call_id == "s1c1"),
                "the first call to end",
            )
            [approval_id] = parked()
            decided = alice.approve(approval_id)
            result = loop.result()
            detail = olga.runs.get(run_id)
    finally:
        release.touch()
    assert result.state is State.COMPLETED
    assert decided.decided_at is not None
    states = [e.to_state for e in detail.events]
    into = states.index(State.AWAITING_APPROVAL)
    back = detail.events[into + 1]
    assert (back.from_state, back.to_state) == (State.AWAITING_APPROVAL, State.RUNNING_TOOLS)
    # It left awaiting_approval because the parked call was decided, not because s1c1 moved.
    assert "s1c1" not in back.reason
    assert back.at >= decided.decided_at


@pytest.mark.parametrize("stop_by", ["cancel", "deadline"])
def test_a_parked_call_does_not_hold_a_stopped_run(guarded: Daemon, stop_by: str) -> None:
    """A cancel or the deadline ends a run whose call awaits approval; the call never runs."""
    run_id = f"parked-then-{stop_by}"
    limits = {"deadline_seconds": 1.0} if stop_by == "deadline" else {}
    model = S([S.calls(("run_command", {"argv": ["touch", f"{run_id}.txt"]})), S.answer("no")])

    def run() -> LoopResult:
        with as_(guarded, "bot") as bot:
            return Loop(bot, model, limits=limits).run("touch", run_id=run_id)

    began = time.monotonic()
    loop = Background(run)
    with as_(guarded, "alice") as alice, as_(guarded, "olga") as olga:
        wait_until(
            lambda: [a for a in alice.approvals_pending() if a.run_id == run_id], "the call parked"
        )
        if stop_by == "cancel":
            olga.runs.cancel(run_id, reason="not needed")
        result = loop.result(timeout=10)
        assert time.monotonic() - began < 8
        assert not [a for a in alice.approvals_pending() if a.run_id == run_id]
        detail = olga.runs.get(run_id)

    want = (State.CANCELLED, "cancelled") if stop_by == "cancel" else (State.EXPIRED, "deadline")
    assert (result.state, result.rule) == want
    assert len(model.requests) == 1
    assert not (guarded.workspace / f"{run_id}.txt").exists()
    parked = outcome_of(detail, "s1c1")
    assert parked.status is Status.REJECTED
    assert parked.error_class == ("cancelled" if stop_by == "cancel" else "timeout")
    assert parked.mark("started") is None
    assert_continuous(run_id, detail.events)
    assert ("running_tools", "awaiting_approval") in edges(detail.events)
    assert terminal(detail).to_state is want[0]
