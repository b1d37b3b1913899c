"""How a run ends when the model's turn did not end normally, when the answer arrives on
the request that crosses a budget, when the provider fails for a moment, and what a
completion says backs it -- through a real daemon, with the real provider adapters
talking to a local server that speaks their wire formats (tests/model_server.py).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execgate.client import CallNotFound, Client, Loop, SoFar, Status, Verdict
from execgate.client.loop.batch import reconcile, to_call
from execgate.client.loop.record import Planned
from execgate.client.loop.retry import Retry
from execgate.client.loop.states import State
from execgate.client.loop.stops import MaxSteps, MaxTokens, StopRules
from execgate.client.models import (
    AnthropicMessagesModel,
    OpenAIChatModel,
    ScriptedModel,
    Turn,
    Usage,
)
from tests.daemon import Daemon
from tests.loop_support import (
    Background,
    assert_continuous,
    edges,
    start_daemon,
    stop,
    terminal,
)
from tests.model_server import (  # noqa: F401 (the model_server and closed_port fixtures)
    ModelServer,
    closed_port_fixture,
    fixture,
    model_server_fixture,
)
from tests.support import wait_until

S = ScriptedModel
# Retries without waiting: the backoff is still computed and recorded.
NO_WAIT = Retry(attempts=3, base_s=0.0, max_s=0.0)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("endings"))
    (d.workspace / "a.txt").write_text("alpha\n")
    yield d
    stop(d)


@pytest.fixture
def eg(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.address) as c:
        yield c


def _openai(server: ModelServer, **kw: Any) -> OpenAIChatModel:
    return OpenAIChatModel("gpt-4o", base_url=server.url, api_key="sk-test", **kw)


def _anthropic(server: ModelServer, **kw: Any) -> AnthropicMessagesModel:
    return AnthropicMessagesModel("claude-sonnet-4", base_url=server.url, api_key="k", **kw)


def _openai_answer(finish_reason: str, **message: Any) -> dict[str, Any]:
    doc = copy.deepcopy(fixture("openai_answer"))
    doc["choices"][0]["finish_reason"] = finish_reason
    doc["choices"][0]["message"].update(message)
    return doc


def _anthropic_answer(stop_reason: str) -> dict[str, Any]:
    doc = copy.deepcopy(fixture("anthropic_answer"))
    doc["stop_reason"] = stop_reason
    return doc


# ---------------------------------------------------------------- stop reasons


@pytest.mark.parametrize(
    ("make", "body", "rule"),
    [
        ("openai", _openai_answer("length"), "truncated"),
        ("anthropic", _anthropic_answer("max_tokens"), "truncated"),
        ("openai", _openai_answer("content_filter"), "refused"),
        ("openai", _openai_answer("stop", content=None, refusal="I can't help."), "refused"),
        ("anthropic", _anthropic_answer("refusal"), "refused"),
        ("anthropic", _anthropic_answer("something_new"), "unexpected_stop"),
    ],
)
def test_a_turn_the_model_did_not_end_never_completes(
    eg: Client, model_server: ModelServer, make: str, body: dict[str, Any], rule: str
) -> None:
    model_server.reply(body=body)
    model = _openai(model_server) if make == "openai" else _anthropic(model_server)
    result = Loop(eg, model).run("summarise a.txt")
    assert result.state is State.FAILED
    assert result.rule == rule
    assert result.answer == ""
    last = terminal(eg.runs.get(result.run_id))
    assert last.data["rule"] == rule
    assert last.data["stop_reason"] in (
        body.get("stop_reason"),
        body.get("choices", [{}])[0].get("finish_reason"),
        "refusal",
    )


def test_a_truncated_turn_with_calls_runs_none_of_them(eg: Client) -> None:
    cut = S.calls(("read_file", {"path": "a.txt"}))
    cut = type(cut)(cut.text, cut.tool_calls, cut.usage, "max_tokens")
    result = Loop(eg, S([cut])).run("read a.txt")
    detail = eg.runs.get(result.run_id)
    assert (result.state, result.rule) == (State.FAILED, "truncated")
    assert detail.calls == ()
    assert terminal(detail).data["not_run"] == [
        {"name": "read_file", "arguments": {"path": "a.txt"}}
    ]


def test_a_paused_turn_is_continued(eg: Client, model_server: ModelServer) -> None:
    paused = _anthropic_answer("pause_turn")
    paused["content"] = [{"type": "text", "text": "Searching..."}]
    model_server.reply(body=paused)
    model_server.reply(fixture_name="anthropic_answer")
    result = Loop(eg, _anthropic(model_server)).run("look it up")
    detail = eg.runs.get(result.run_id)
    assert result.state is State.COMPLETED
    assert len(model_server.requests) == 2
    # The paused turn goes back as the last (assistant) message, for the model to go on.
    assert model_server.requests[1].body["messages"][-1]["role"] == "assistant"
    assert ("validating", "requesting_model") in edges(detail.events)
    assert_continuous(result.run_id, detail.events)


def test_a_scripted_turn_carries_its_stop_reason(eg: Client) -> None:
    result = Loop(eg, S([S.answer("half a sent", stop_reason="length")])).run("write")
    assert (result.state, result.rule) == (State.FAILED, "truncated")
    assert terminal(eg.runs.get(result.run_id)).data["text"] == "half a sent"


# ---------------------------------------------------------------- budgets


def test_an_answer_on_the_budget_crossing_request_completes(eg: Client) -> None:
    model = S(
        [
            S.calls(("read_file", {"path": "a.txt"}), usage=Usage(60, 20)),
            S.answer("a.txt says alpha", usage=Usage(70, 30)),
        ]
    )
    stops = StopRules([MaxTokens(100), MaxSteps(10)])
    result = Loop(eg, model, stops=stops).run("read a.txt")
    assert result.state is State.COMPLETED
    assert result.answer == "a.txt says alpha"
    assert result.figures["tokens"] == 180
    assert result.figures["overrun"] == {"rule": "max_tokens", "limit": 100, "tokens": 180}
    recorded = terminal(eg.runs.get(result.run_id)).data["figures"]
    assert recorded["overrun"]["tokens"] == 180


def test_calls_proposed_on_the_budget_crossing_request_never_run(eg: Client) -> None:
    model = S(
        [
            S.calls(("read_file", {"path": "a.txt"}), usage=Usage(60, 60)),
            S.answer("never asked"),
        ]
    )
    result = Loop(eg, model, stops=StopRules([MaxTokens(100)])).run("read a.txt")
    detail = eg.runs.get(result.run_id)
    assert (result.state, result.rule) == (State.BUDGET_EXHAUSTED, "max_tokens")
    assert detail.calls == ()
    assert model.remaining == 1


def test_a_rejected_answer_past_the_budget_is_not_asked_again(eg: Client) -> None:
    model = S([S.answer("wrong", usage=Usage(90, 20)), S.answer("never asked")])
    reject = lambda so_far: Verdict(False, "no")  # noqa: E731
    loop = Loop(eg, model, stops=StopRules([MaxTokens(100)]), verifier=reject)
    result = loop.run("answer")
    assert (result.state, result.rule) == (State.BUDGET_EXHAUSTED, "max_tokens")
    assert model.remaining == 1


# ---------------------------------------------------------------- transient errors


def test_a_429_then_success_completes_with_the_retry_recorded(
    eg: Client, model_server: ModelServer
) -> None:
    model_server.reply(429, fixture_name="openai_error_429", headers={"retry-after": "0"})
    model_server.reply(fixture_name="openai_answer")
    result = Loop(eg, _openai(model_server), retry=NO_WAIT).run("find the TODOs")
    assert result.state is State.COMPLETED
    assert len(model_server.requests) == 2
    detail = eg.runs.get(result.run_id)
    [replied] = [e for e in detail.events if e.to_state is State.VALIDATING]
    [retry] = replied.data["retries"]
    assert (retry["retry"], retry["error"], retry["status"]) == (1, "ModelRateLimited", 429)


def test_5xx_and_529_are_retried(eg: Client, model_server: ModelServer) -> None:
    model_server.reply(500, fixture_name="anthropic_error_500")
    model_server.reply(529, fixture_name="anthropic_error_529")
    model_server.reply(fixture_name="anthropic_answer")
    result = Loop(eg, _anthropic(model_server), retry=NO_WAIT).run("find the TODOs")
    assert result.state is State.COMPLETED
    [replied] = [e for e in terminal_and_all(eg, result.run_id) if e.to_state is State.VALIDATING]
    assert [r["status"] for r in replied.data["retries"]] == [500, 529]


@pytest.mark.parametrize("status", [400, 401, 404])
def test_a_request_error_fails_at_once(eg: Client, model_server: ModelServer, status: int) -> None:
    model_server.reply(status, fixture_name="openai_error_400")
    model_server.reply(fixture_name="openai_answer")  # never asked for
    result = Loop(eg, _openai(model_server), retry=NO_WAIT).run("find the TODOs")
    assert (result.state, result.rule) == (State.FAILED, "model_error")
    assert len(model_server.requests) == 1
    assert "retries" not in terminal(eg.runs.get(result.run_id)).data


def test_connection_errors_are_retried_then_fail_with_every_retry_recorded(
    eg: Client, closed_port: int
) -> None:
    model = OpenAIChatModel("m", base_url=f"http://127.0.0.1:{closed_port}/v1", api_key="")
    result = Loop(eg, model, retry=NO_WAIT).run("anything")
    assert (result.state, result.rule) == (State.FAILED, "model_error")
    data = terminal(eg.runs.get(result.run_id)).data
    assert [r["retry"] for r in data["retries"]] == [1, 2, 3]
    assert {r["error"] for r in data["retries"]} == {"ModelUnavailable"}


def test_a_retry_is_not_waited_for_past_the_run_deadline(
    eg: Client, model_server: ModelServer
) -> None:
    model_server.reply(429, fixture_name="openai_error_429", headers={"retry-after": "3600"})
    model_server.reply(fixture_name="openai_answer")
    slept: list[float] = []
    retry = Retry(attempts=3, sleep=slept.append)
    loop = Loop(eg, _openai(model_server), retry=retry, limits={"deadline_seconds": 60})
    result = loop.run("find the TODOs")
    assert (result.state, result.rule) == (State.FAILED, "model_error")
    assert slept == []
    [given_up] = terminal(eg.runs.get(result.run_id)).data["retries"]
    assert given_up["wait_s"] == 0


def terminal_and_all(eg: Client, run_id: str) -> tuple[Any, ...]:
    detail = eg.runs.get(run_id)
    terminal(detail)
    return detail.events


# ---------------------------------------------------------------- what backs a completion


def _says_alpha(so_far: SoFar) -> Verdict:
    ok = any(tool == "read_file" and o.ok for tool, _, o in so_far.calls)
    return Verdict(ok, "read_file of a.txt succeeded" if ok else "nothing was read")


def test_a_verified_completion_names_its_verifier_and_finding(eg: Client) -> None:
    model = S([S.calls(("read_file", {"path": "a.txt"})), S.answer("alpha")])
    result = Loop(eg, model, verifier=_says_alpha).run("read a.txt")
    assert result.completed
    assert result.verified
    assert result.verification is not None
    assert result.verification.verifier == "_says_alpha"
    assert result.verification.finding == "read_file of a.txt succeeded"
    assert result.caveats == ()
    data = terminal(eg.runs.get(result.run_id)).data
    assert data["verification"] == {
        "verifier": "_says_alpha",
        "verified": True,
        "finding": "read_file of a.txt succeeded",
    }


def test_a_completion_without_verifier_is_unverified_and_shows_failed_calls(
    eg: Client, daemon: Daemon
) -> None:
    model = S([S.calls(("read_file", {"path": "missing.txt"})), S.answer("it is empty")])
    result = Loop(eg, model).run("read missing.txt")
    assert result.completed
    assert not result.verified
    assert result.verification is not None
    assert result.verification.label == "unverified"
    [caveat] = result.caveats
    assert caveat.startswith("answer followed 1 failed call(s): s1c1 read_file failure")
    shown = _cli(daemon, "runs", "show", result.run_id)
    assert "unverified" in shown
    assert "answer followed 1 failed call(s)" in shown
    page = daemon.root / f"{result.run_id}.html"
    _cli(daemon, "trace", result.run_id, "--html", str(page))
    [banner] = re.findall(r'<p class="([^"]*)" id="stop">(.*?)</p>', page.read_text())
    assert banner[0].split() == ["stop", "completed", "unverified", "caveats"]
    assert "unverified: no verifier ran" in banner[1]
    assert "answer followed 1 failed call(s)" in banner[1]
    stop_json = json.loads(_cli(daemon, "trace", result.run_id, "--json"))["stop"]
    assert stop_json["backing"] == "unverified: no verifier ran"
    assert stop_json["caveats"] == list(result.caveats)


def test_a_verified_clean_completion_is_plain_on_the_trace_page(eg: Client, daemon: Daemon) -> None:
    model = S([S.calls(("read_file", {"path": "a.txt"})), S.answer("alpha")])
    result = Loop(eg, model, verifier=_says_alpha).run("read a.txt")
    page = daemon.root / f"{result.run_id}.html"
    _cli(daemon, "trace", result.run_id, "--html", str(page))
    [banner] = re.findall(r'<p class="([^"]*)" id="stop">(.*?)</p>', page.read_text())
    assert banner[0].split() == ["stop", "completed"]
    assert "verified by _says_alpha: read_file of a.txt succeeded" in banner[1]
    assert "verified by _says_alpha" in _cli(daemon, "runs", "show", result.run_id)


def test_a_verifier_that_fails_the_run_is_named_in_its_record(eg: Client) -> None:
    def never(so_far: SoFar) -> Verdict:
        return Verdict(False, "no file was read")

    loop = Loop(eg, S([S.answer("guess")]), verifier=never, on_rejected_answer="fail")
    result = loop.run("read a.txt")
    assert (result.state, result.rule) == (State.FAILED, "verifier")
    assert result.verification is not None
    assert (result.verification.verifier, result.verification.verified) == ("never", False)
    assert (
        terminal(eg.runs.get(result.run_id)).data["verification"]["finding"] == "no file was read"
    )


# ---------------------------------------------------------------- ScriptedModel


def test_an_endless_script_is_read_lazily(eg: Client) -> None:
    pulled: list[int] = []

    def endless() -> Iterator[Turn]:
        for i in itertools.count():
            if i > 100:
                raise AssertionError("the script was read ahead of the run")
            pulled.append(i)
            yield S.calls(("read_file", {"path": "a.txt"}))

    model = S(endless())
    assert model.remaining is None
    result = Loop(eg, model, stops=StopRules([MaxSteps(3)]), limits={}).run("loop")
    assert (result.state, result.rule) == (State.EXPIRED, "max_steps")
    assert len(pulled) == 3
    forever = S(itertools.repeat(S.answer("again")))
    assert Loop(eg, forever).run("once").completed


def _cli(daemon: Daemon, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", *args, "--addr", daemon.address],
        capture_output=True,
        text=True,
        timeout=30,
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# ---------------------------------------------------------------- reconcile on the stream


def test_reconcile_waits_for_a_running_call_on_the_execute_stream(eg: Client) -> None:
    """A call still running when a loop resumes is joined (re-sent with its id and key):
    its outcome comes back on the stream as a replay of the one run, never run twice."""
    run_id = eg.runs.start("sleep a moment").run_id
    p = Planned("s1c1", 0, "m1", "run_command", {"argv": ["sleep", "1"]})
    first = Background(lambda: list(eg.stream([to_call(run_id, p)], run_id=run_id)))
    wait_until(lambda: _running(eg, run_id, "s1c1"), "the call to start")
    outcomes = reconcile(eg, run_id, [p], wait_s=30, deadline=None)
    assert outcomes["s1c1"].status is Status.SUCCESS
    assert outcomes["s1c1"].replay_of == "s1c1"  # from the stream, joined to the one run
    assert [e.kind.value for e in first.result()][-1] == "finished"
    assert [c.call_id for c in eg.runs.get(run_id).calls] == ["s1c1"]


def test_reconcile_gives_up_after_its_wait_and_stops_nothing(eg: Client) -> None:
    run_id = eg.runs.start("sleep a while").run_id
    p = Planned("s1c1", 0, "m1", "run_command", {"argv": ["sleep", "2"]})
    first = Background(lambda: list(eg.stream([to_call(run_id, p)], run_id=run_id)))
    wait_until(lambda: _running(eg, run_id, "s1c1"), "the call to start")
    outcomes = reconcile(eg, run_id, [p], wait_s=0.2, deadline=None)
    assert outcomes["s1c1"].status is Status.UNKNOWN_OUTCOME
    finished = [e for e in first.result() if e.outcome is not None]
    assert [e.outcome.status for e in finished if e.outcome] == [Status.SUCCESS]


def _running(eg: Client, run_id: str, call_id: str) -> bool:
    try:
        return eg.get_call(call_id, run_id=run_id).running
    except CallNotFound:
        return False
