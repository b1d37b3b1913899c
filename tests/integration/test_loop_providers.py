"""The Loop with the real provider adapters: a local server speaking the OpenAI and
Anthropic wire formats (recorded-shape fixtures) drives a real daemon. The second
request must carry the daemon's actual results, matched to the provider's call ids;
the run's record and `execgate runs` show the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execgate.client import Client, Loop
from execgate.client.loop.states import State
from execgate.client.models import AnthropicMessagesModel, OpenAIChatModel
from tests.daemon import Daemon
from tests.loop_support import start_daemon, stop
from tests.model_server import (  # noqa: F401 (the model_server fixture)
    ModelServer,
    fixture,
    model_server_fixture,
)

APP = "def main():\n    pass  # TODO: validate input\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("providers"))
    (d.workspace / "src").mkdir()
    (d.workspace / "src" / "app.py").write_text(APP)
    yield d
    stop(d)


def test_an_openai_compatible_model_runs_a_loop(daemon: Daemon, model_server: ModelServer) -> None:
    model_server.reply(fixture_name="openai_tool_calls")  # read_file + search
    model_server.reply(fixture_name="openai_answer")
    model = OpenAIChatModel("gpt-4o", base_url=model_server.url, api_key="sk-test")
    with Client(daemon.address) as eg:
        result = Loop(eg, model).run("find the TODOs in src/app.py")
        detail = eg.runs.get(result.run_id)
    assert result.state is State.COMPLETED
    assert result.answer.startswith("src/app.py has two TODOs")
    assert result.figures["tokens"] == 470 + 682
    # The second request: the assistant's calls, then one `tool` message per call, in
    # order, each with the call's id and the daemon's real result.
    messages = model_server.requests[1].body["messages"]
    calls = fixture("openai_tool_calls")["choices"][0]["message"]["tool_calls"]
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [c["id"] for c in calls]
    assert "TODO: validate input" in tool_messages[0]["content"]  # read_file's text
    assert "app.py" in tool_messages[1]["content"]  # search found the line
    assert [c.tool for c in detail.calls] == ["read_file", "search"]
    assert all(c.outcome is not None and c.outcome.ok for c in detail.calls)


def test_an_anthropic_model_runs_a_loop(daemon: Daemon, model_server: ModelServer) -> None:
    model_server.reply(fixture_name="anthropic_tool_use")  # read_file + search
    model_server.reply(fixture_name="anthropic_answer")
    model = AnthropicMessagesModel("claude-sonnet-4", base_url=model_server.url, api_key="k")
    with Client(daemon.address) as eg:
        result = Loop(eg, model).run("find the TODOs in src/app.py")
    assert result.state is State.COMPLETED
    # All results of the turn in ONE user message, tool_result blocks first, by id.
    messages = model_server.requests[1].body["messages"]
    last = messages[-1]
    assert last["role"] == "user"
    blocks = last["content"]
    uses = [b["id"] for b in fixture("anthropic_tool_use")["content"] if b["type"] == "tool_use"]
    assert [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"] == uses
    assert blocks[0]["type"] == "tool_result"
    assert not any(b.get("is_error") for b in blocks)
    assert "TODO: validate input" in _text(blocks[0]["content"])


def test_runs_cli_lists_shows_and_cancels(daemon: Daemon, model_server: ModelServer) -> None:
    model_server.reply(fixture_name="openai_tool_calls")
    model_server.reply(fixture_name="openai_answer")
    model = OpenAIChatModel("gpt-4o", base_url=model_server.url, api_key="sk-test")
    with Client(daemon.address) as eg:
        done = Loop(eg, model).run("find the TODOs")
        open_run = eg.runs.start("left open").run_id
    listed = json.loads(_cli(daemon, "runs", "list", "--json").stdout)
    by_id = {r["run_id"]: r for r in listed}
    assert by_id[done.run_id]["state"] == "completed"
    assert by_id[open_run]["state"] == "created"
    active = json.loads(_cli(daemon, "runs", "list", "--state", "active", "--json").stdout)
    assert open_run in {r["run_id"] for r in active}
    assert done.run_id not in {r["run_id"] for r in active}
    shown = _cli(daemon, "runs", "show", done.run_id).stdout
    for text in ("completed", "validating → running_tools", "read_file", "search"):
        assert text in shown, shown
    cancelled = _cli(daemon, "runs", "cancel", open_run, "--reason", "not needed")
    assert "cancel requested by local" in cancelled.stdout
    with Client(daemon.address) as eg:
        info = eg.runs.get(open_run).run
    assert info.cancel is not None
    assert info.cancel.reason == "not needed"
    missing = _cli(daemon, "runs", "show", "no-such-run", check=False)
    assert missing.returncode == 1
    assert "no run 'no-such-run'" in missing.stderr


def _cli(daemon: Daemon, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", *args, "--addr", daemon.address],
        capture_output=True,
        text=True,
        timeout=30,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content)
