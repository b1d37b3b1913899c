"""`execgate mcp` driven by the official `mcp` Python SDK's client, which launches it over
stdio (as any MCP client does) against a real daemon: tools and their annotations,
outcomes as results, a policy deny, an approval wait told as progress, a cancel from the
client stopping the call through the ladder, idempotent replays, UNKNOWN_OUTCOME, the
2026-07-28 protocol. (Over streamable HTTP: test_mcp_bridge_http.py.)"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.client import Client as McpClient
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from execgate.client import AsyncClient, CallRecord, Status, StopMode
from tests import bridge_support as bs
from tests import mcp_support as ms
from tests.daemon import Daemon, scaled

pytestmark = pytest.mark.timeout(240)

KEY = "execgate/idempotencyKey"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with bs.served(tmp_path_factory.mktemp("bridge")) as d:
        yield d


def test_tools_list_carries_schemas_and_effects(daemon: Daemon) -> None:
    async def body() -> dict[str, types.Tool]:
        async with bs.bridged(daemon) as s:
            return {t.name: t for t in (await s.list_tools()).tools}

    tools = anyio.run(body)
    # Built-ins, the declared command tool, both servers' tools: the daemon's whole list.
    assert {"read_file", "run_command", "echo_hi", "faulty.echo", "everything.echo"} <= set(tools)
    read = tools["read_file"]
    assert read.input_schema["type"] == "object"
    assert "path" in read.input_schema["properties"]
    assert read.annotations is not None
    assert read.annotations.read_only_hint is True
    # Hints that mean nothing for a reader are not made up.
    assert (read.annotations.destructive_hint, read.annotations.idempotent_hint) == (None, None)
    write = tools["write_file"].annotations
    assert write is not None
    assert (write.read_only_hint, write.destructive_hint, write.idempotent_hint) == (
        False,
        True,
        True,
    )
    command = tools["run_command"].annotations
    assert command is not None
    assert (command.read_only_hint, command.idempotent_hint) == (False, False)
    # A declared command whose effects only read is a reader.
    declared = tools["echo_hi"].annotations
    assert declared is not None
    assert declared.read_only_hint is True
    assert tools["echo_hi"].meta == {
        "execgate/provider": "command",
        "execgate/annotationsTrusted": True,
    }
    # The untrusted server says its echo is read-only; the daemon does not believe it.
    untrusted = tools["faulty.echo"]
    assert untrusted.annotations == types.ToolAnnotations(read_only_hint=False)
    assert untrusted.meta is not None
    assert untrusted.meta["execgate/annotationsTrusted"] is False
    # A trusted server's reader stays one.
    trusted = tools["everything.echo"].annotations
    assert trusted is not None
    assert trusted.read_only_hint is True


def test_success_is_content_and_structured_status(daemon: Daemon) -> None:
    async def body() -> types.CallToolResult:
        async with bs.bridged(daemon) as s:
            return await s.call_tool("read_file", {"path": "hello.txt"})

    result = anyio.run(body)
    assert result.is_error is False
    assert bs.text(result) == "hello from the workspace\n"
    structured = result.structured_content
    assert structured["status"] == "SUCCESS"
    assert structured["evidence"]["bytes_read"] == len("hello from the workspace\n")
    assert structured["evidence"]["path"].endswith("/workspace/hello.txt")
    assert re.fullmatch(r"mcp-[0-9a-f]{12}-\d+", structured["call_id"])
    assert structured["run_id"] == "mcp-" + structured["call_id"].split("-")[1]


def test_the_call_is_the_bridges_identitys(daemon: Daemon) -> None:
    """No token configured: the local `agent` token beside the socket; the journal says so."""

    async def body() -> CallRecord:
        async with bs.bridged(daemon, "--run-id", "who") as s:
            result = await s.call_tool("noop", {"echo": "me"})
        async with AsyncClient(daemon.address, token=bs.token(daemon, "operator")) as op:
            return await op.get_call(result.structured_content["call_id"], run_id="who")

    record = anyio.run(body)
    assert record.agent == "agent"
    assert record.outcome is not None
    assert record.outcome.text == "me"


def test_the_clients_trace_context_reaches_the_daemons_spans(daemon: Daemon) -> None:
    """A client's `_meta.traceparent` (MCP's trace context) is the parent of the call's
    spans in the daemon's journal: the bridge adds no trace of its own, and no gap."""
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    meta = {"traceparent": f"00-{trace_id}-{parent}-01"}

    async def body() -> str:
        async with bs.bridged(daemon, "--run-id", "traced") as s:
            result = await s.call_tool("noop", {"echo": "t"}, meta=meta)
        return str(result.structured_content["call_id"])

    call_id = anyio.run(body)
    uri = f"file:{daemon.state_dir / 'journal.db'}?mode=ro"

    def spans() -> list[tuple[str, str]]:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            rows = conn.execute("SELECT trace_id, parent_id FROM spans WHERE call_id=?", (call_id,))
            return [(str(t), str(p)) for t, p in rows]

    ms.wait_for(lambda: bool(spans()), 30, "the call's spans in the journal")
    assert {t for t, _ in spans()} == {trace_id}


def test_failure_is_an_error_result_with_its_class(daemon: Daemon) -> None:
    async def body() -> types.CallToolResult:
        async with bs.bridged(daemon) as s:
            return await s.call_tool("run_command", {"argv": ["sh", "-c", "echo out; exit 3"]})

    result = anyio.run(body)
    assert result.is_error is True
    first, second = (c.text for c in result.content if isinstance(c, types.TextContent))
    assert first.startswith("execgate: FAILURE (nonzero_exit): exited with status 3"), first
    assert second == "out\n"
    assert result.structured_content["evidence"]["exit_code"] == 3


def test_a_policy_deny_names_the_rule(daemon: Daemon) -> None:
    async def body() -> types.CallToolResult:
        async with bs.bridged(daemon) as s:
            return await s.call_tool("read_file", {"path": "secret.txt"})

    result = anyio.run(body)
    assert result.is_error is True
    said = bs.text(result)
    assert said.startswith("execgate: REJECTED (policy_denied): denied by policy (no-secrets)")
    assert "the secret stays where it is" in said
    assert "do not read" not in said
    assert result.structured_content["status"] == "REJECTED"


def test_an_unknown_tool_is_a_rejected_result(daemon: Daemon) -> None:
    """Refused and journaled by the daemon like any call, so a result, not a JSON-RPC error."""

    async def body() -> types.CallToolResult:
        async with bs.bridged(daemon) as s:
            return await s.call_tool("no_such_tool", {})

    result = anyio.run(body)
    assert result.is_error is True
    assert bs.text(result).startswith("execgate: REJECTED (unknown_tool)"), bs.text(result)


def test_an_approval_wait_is_progress_then_the_operator_says_yes(daemon: Daemon) -> None:
    said: list[tuple[float, str]] = []
    decided: list[str] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        said.append((value, message or ""))
        # Approved once the wait was said again (the heartbeat), not at once.
        m = re.match(r"still waiting for approval (\S+) by an operator", message or "")
        if m and not decided:
            async with AsyncClient(daemon.address, token=bs.token(daemon, "operator")) as op:
                decided.append((await op.approve(m.group(1), "fine")).decided_by)

    async def body() -> types.CallToolResult:
        async with bs.bridged(daemon, "--heartbeat", "0.2") as s:
            return await s.call_tool(
                "run_command", {"argv": ["touch", "approved.txt"]}, progress_callback=progress
            )

    result = anyio.run(body)
    assert result.is_error is False, bs.text(result)
    assert decided == ["operator"]
    assert (daemon.workspace / "approved.txt").exists()
    first = said[0][1]
    assert first.startswith("waiting for approval appr_"), said
    assert "(rule ask-before-touch: a human says yes first; approvers: approver;" in first
    assert "execgate approvals approve appr_" in first
    assert said[1][1].startswith(f"still {first} ("), said
    assert said[-1][1] == "running"
    # MCP: each notification's progress is larger than the last.
    values = [v for v, _ in said]
    assert values == sorted(set(values)), said


def test_progress_of_an_mcp_tool_reaches_the_client(daemon: Daemon) -> None:
    said: list[str] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        said.append(message or "")

    async def body() -> types.CallToolResult:
        async with bs.bridged(daemon) as s:
            return await s.call_tool(
                "everything.trigger-long-running-operation",
                {"duration": 1.5, "steps": 5},
                progress_callback=progress,
            )

    result = anyio.run(body)
    assert result.is_error is False, bs.text(result)
    tool_said = [m for m in said if m.startswith("running: ")]
    assert len(tool_said) >= 2, said
    assert all(re.match(r"running: \d+/5\b", m) for m in tool_said), said


def test_a_client_cancel_stops_the_call_and_a_retry_replays_it(daemon: Daemon) -> None:
    """The client gives up on a running command: the bridge Cancels it (dropping the
    stream would not stop it), the ladder ends it, and its UNKNOWN_OUTCOME is what a
    retry with the same key gets, without a second run."""
    run_id = "bridge-cancel"
    argv = ["sh", "-c", "echo ran >> cancelled.txt; sleep 60"]
    meta = {KEY: "cancel-me-1"}

    async def body() -> tuple[CallRecord, types.CallToolResult]:
        async with AsyncClient(daemon.address, token=bs.token(daemon, "operator")) as eg:
            async with bs.bridged(daemon, "--run-id", run_id) as s:
                with anyio.CancelScope() as scope:

                    async def stop_when_running() -> None:
                        await bs.until(lambda: bs.running(eg, run_id, "run_command"), 30, "running")
                        scope.cancel()

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(stop_when_running)
                        await s.call_tool("run_command", {"argv": argv}, meta=meta)
                assert scope.cancelled_caught

                record = await bs.until(
                    lambda: bs.ended(eg, run_id, "run_command"), 30, "the cancelled call's outcome"
                )
            async with bs.bridged(daemon) as again:
                retry = await again.call_tool("run_command", {"argv": argv}, meta=meta)
        return record, retry

    record, retry = anyio.run(body)
    outcome = record.outcome
    assert outcome is not None
    assert (outcome.status, outcome.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled")
    assert outcome.stopped_how is StopMode.COOPERATIVE, outcome
    asked = outcome.mark("cancel_requested")
    assert asked is not None
    assert "cancelled by the MCP client" in asked.detail, outcome.timeline
    assert outcome.mark("signal_sent") is not None
    # The retry: the recorded outcome, told to reconcile; the command did not run again.
    assert retry.is_error is True
    said = bs.text(retry)
    assert said.startswith("execgate: UNKNOWN_OUTCOME (cancelled)"), said
    assert f"the recorded outcome of call {record.call_id}" in said
    assert "reconcile before retrying" in said
    assert retry.structured_content["replay_of"] == record.call_id
    assert (daemon.workspace / "cancelled.txt").read_text() == "ran\n"


def test_an_idempotent_retry_from_another_session_runs_once(daemon: Daemon) -> None:
    argv = ["sh", "-c", "echo once >> once.txt"]

    async def call(meta: dict[str, Any], args: list[str]) -> types.CallToolResult:
        async with bs.bridged(daemon) as s:
            return await s.call_tool("run_command", {"argv": args}, meta=meta)

    async def body() -> list[types.CallToolResult]:
        first = await call({KEY: "once-1"}, argv)
        second = await call({KEY: "once-1"}, argv)
        other = await call({KEY: "once-1"}, ["sh", "-c", "echo other >> once.txt"])
        return [first, second, other]

    first, second, other = anyio.run(body)
    assert first.is_error is False, bs.text(first)
    assert second.is_error is False, bs.text(second)
    assert second.structured_content["replay_of"] == first.structured_content["call_id"]
    assert (daemon.workspace / "once.txt").read_text() == "once\n"
    # The same key with other arguments is refused, not run.
    assert other.is_error is True
    assert bs.text(other).startswith("execgate: REJECTED (idempotency_conflict)")


def test_no_key_means_a_retry_runs_again(daemon: Daemon) -> None:
    """What is not deduplicated: a retry is a new request (a new id), so without the
    client's key it is a new call."""
    argv = ["sh", "-c", "echo again >> twice.txt"]

    async def body() -> None:
        async with bs.bridged(daemon) as s:
            for _ in range(2):
                result = await s.call_tool("run_command", {"argv": argv})
                assert result.is_error is False, bs.text(result)

    anyio.run(body)
    assert (daemon.workspace / "twice.txt").read_text() == "again\nagain\n"


def test_unknown_outcome_says_to_reconcile(daemon: Daemon) -> None:
    """`work` may write, and the policy gives it 1 s: interrupted, nobody knows what it did."""

    async def body() -> types.CallToolResult:
        async with bs.bridged(daemon) as s:
            return await s.call_tool("work", {"path": "counter.txt", "write": True, "seconds": 30})

    result = anyio.run(body)
    assert result.is_error is True
    said = bs.text(result)
    assert said.startswith("execgate: UNKNOWN_OUTCOME (timeout)"), said
    assert "reconcile before retrying" in said
    assert "never repeat it blindly" in said
    assert result.structured_content["status"] == "UNKNOWN_OUTCOME"


def test_a_malformed_key_is_invalid_params_naming_it(daemon: Daemon) -> None:
    async def body() -> MCPError:
        async with bs.bridged(daemon) as s:
            with pytest.raises(MCPError) as caught:
                await s.call_tool("noop", {}, meta={KEY: 7})
            return caught.value

    error = anyio.run(body)
    assert error.code == types.INVALID_PARAMS
    assert f'_meta["{KEY}"]: must be a non-empty string' in error.message


def test_a_bad_token_and_no_daemon_are_errors_not_hangs(daemon: Daemon, tmp_path: Path) -> None:
    async def tools(**env: str) -> MCPError:
        async with bs.bridged(daemon, **env) as s:
            with pytest.raises(MCPError) as caught:
                await s.list_tools()
            return caught.value

    stranger = anyio.run(lambda: tools(EXECGATE_TOKEN="not-a-token"))
    assert "does not know who we are" in stranger.message
    nobody = anyio.run(lambda: tools(EXECGATE_ADDR=f"unix:{tmp_path}/none.sock"))
    assert "no execgate daemon answers" in nobody.message


def test_the_readme_configuration_launches_the_bridge(daemon: Daemon) -> None:
    """The README's MCP client snippet, as a client would run it (its env filled in with
    this daemon's address and agent token)."""
    config = bs.readme_config()
    server = config["mcpServers"]["execgate"]
    assert server["command"] == "execgate"
    assert set(server["env"]) == {"EXECGATE_ADDR", "EXECGATE_TOKEN"}
    params = StdioServerParameters(
        command=bs.EXECGATE,
        args=server["args"],
        env={"EXECGATE_ADDR": daemon.address, "EXECGATE_TOKEN": bs.token(daemon, "agent")},
    )

    async def body() -> types.CallToolResult:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            return await s.call_tool("noop", {"echo": "configured"})

    result = anyio.run(body)
    assert (result.is_error, bs.text(result)) == (False, "configured")


def test_the_2026_protocol_through_the_sdks_high_level_client(daemon: Daemon) -> None:
    """`mcp.client.Client` probes `server/discover` and speaks 2026-07-28 (no handshake,
    a `_meta` envelope per request): calls, progress and a cancel work the same."""
    run_id = "bridge-modern"
    params = StdioServerParameters(
        command=bs.EXECGATE, args=["mcp", "--run-id", run_id], env=bs.bridge_env(daemon)
    )

    async def body() -> tuple[str, types.CallToolResult, CallRecord]:
        async with (
            AsyncClient(daemon.address, token=bs.token(daemon, "operator")) as eg,
            McpClient(params) as client,
        ):
            read = await client.call_tool("read_file", {"path": "hello.txt"})
            with anyio.CancelScope() as scope:

                async def stop_when_running() -> None:
                    await bs.until(lambda: bs.running(eg, run_id, "run_command"), 30, "running")
                    scope.cancel()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(stop_when_running)
                    await client.call_tool("run_command", {"argv": ["sleep", "60"]})

            outcome = await bs.until(lambda: bs.ended(eg, run_id, "run_command"), 30, "outcome")
            return client.protocol_version, read, outcome

    version, read, cancelled = anyio.run(body)
    assert version == "2026-07-28"
    assert (read.is_error, bs.text(read)) == (False, "hello from the workspace\n")
    assert cancelled.outcome is not None
    asked = cancelled.outcome.mark("cancel_requested")
    assert asked is not None
    assert "cancelled by the MCP client" in asked.detail


def test_stdin_from_a_file_is_served_too(tmp_path: Path) -> None:
    """A pipe is served on the event loop (every test above); a file (or a terminal) by
    the SDK's own threaded reader: the same answers."""
    lines = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "file", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
    ]
    given = tmp_path / "in.jsonl"
    given.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with given.open() as stdin:
        ran = subprocess.run(
            [bs.EXECGATE, "mcp"], stdin=stdin, capture_output=True, text=True, timeout=scaled(30)
        )
    assert ran.returncode == 0, ran.stderr
    answers = [json.loads(line) for line in ran.stdout.splitlines()]
    assert [a["id"] for a in answers] == [1, 2]
    assert answers[0]["result"]["serverInfo"]["name"] == "execgate"
    assert answers[1]["result"] == {}
