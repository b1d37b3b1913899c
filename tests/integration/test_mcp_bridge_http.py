"""`execgate mcp --http`: streamable HTTP on loopback, driven by the `mcp` Python SDK's
streamable HTTP client (and, for a re-posted request, by plain HTTP) against a real daemon:
calls, a cancel reaching the call, a request delivered twice running once, and the
refusal of any listen address off loopback."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from execgate.client import AsyncClient, CallRecord
from tests import bridge_support as bs
from tests.daemon import Daemon, scaled

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with bs.served(tmp_path_factory.mktemp("bridge-http")) as d:
        yield d


def test_streamable_http_on_loopback(daemon: Daemon) -> None:
    with bs.http_bridge(daemon) as url:

        async def body() -> tuple[list[str], types.CallToolResult]:
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as s,
            ):
                await s.initialize()
                names = [t.name for t in (await s.list_tools()).tools]
                return names, await s.call_tool("read_file", {"path": "hello.txt"})

        names, result = anyio.run(body)
    assert "read_file" in names
    assert (result.is_error, bs.text(result)) == (False, "hello from the workspace\n")
    # An HTTP session's run is named by a hash of its session id, never by the id itself.
    assert re.fullmatch(r"mcp-[0-9a-f]{12}", result.structured_content["run_id"])


def test_a_cancel_over_http_reaches_the_call(daemon: Daemon) -> None:
    """An HTTP session is named alike in every request of it: the cancel (its own POST)
    finds the call the tools/call started."""
    run_id = "bridge-http-cancel"

    async def body(url: str) -> CallRecord:
        async with (
            AsyncClient(daemon.address, token=bs.token(daemon, "operator")) as eg,
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            with anyio.CancelScope() as scope:

                async def stop_when_running() -> None:
                    await bs.until(lambda: bs.running(eg, run_id, "run_command"), 30, "running")
                    scope.cancel()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(stop_when_running)
                    await s.call_tool("run_command", {"argv": ["sleep", "60"]})

            # In the session: the cancel is a POST of its own, which a session the
            # client closes at once may not outlive.
            return await bs.until(
                lambda: bs.ended(eg, run_id, "run_command"), 30, "the cancelled call's outcome"
            )

    with bs.http_bridge(daemon, "--run-id", run_id) as url:
        record = anyio.run(body, url)
    assert record.outcome is not None
    assert record.outcome.error_class == "cancelled"
    asked = record.outcome.mark("cancel_requested")
    assert asked is not None
    assert "cancelled by the MCP client" in asked.detail


def _posted(reply: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message of a streamable HTTP reply (JSON, or one SSE event)."""
    if reply.headers["content-type"].startswith("application/json"):
        return dict(reply.json())
    [data] = [ln[5:] for ln in reply.text.splitlines() if ln.startswith("data:")]
    return dict(json.loads(data))


def test_a_request_posted_twice_over_http_runs_once(daemon: Daemon) -> None:
    """An HTTP client that lost an answer posts the same message again (same session,
    same request id): without any key of its own it gets the call's outcome, replayed,
    and the command runs once. (Over stdio a message arrives once; no key is derived.)"""
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "run_command", "arguments": {"argv": ["sh", "-c", "echo 1 >> re.txt"]}},
    }
    with bs.http_bridge(daemon) as url, httpx2.Client(timeout=scaled(30)) as http:
        accept = {"accept": "application/json, text/event-stream"}
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "repost", "version": "1"},
            },
        }
        opened = http.post(url, json=init, headers=accept)
        headers = {
            **accept,
            "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": "2025-11-25",
        }
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert http.post(url, json=done, headers=headers).status_code == 202
        first = _posted(http.post(url, json=call, headers=headers))["result"]
        again = _posted(http.post(url, json=call, headers=headers))["result"]
    assert first["isError"] is False, first
    assert again["structuredContent"]["replay_of"] == first["structuredContent"]["call_id"]
    assert (daemon.workspace / "re.txt").read_text() == "1\n"


@pytest.mark.parametrize("where", ["0.0.0.0:0", "192.0.2.1:0", "example.com:0"])
def test_http_off_loopback_is_refused(where: str) -> None:
    ran = subprocess.run(
        [bs.EXECGATE, "mcp", "--http", where],
        capture_output=True,
        text=True,
        timeout=scaled(30),
    )
    assert ran.returncode == 1, ran.stderr
    assert "not a loopback address" in ran.stderr
    assert "Traceback" not in ran.stderr
