"""`execgate mcp --workspace NAME` against a real daemon (bwrap) whose policy gives the
bridge's identity (the local `agent`) two workspaces: `default`, the daemon's --workspace
and its first, and `side`. `theirs` exists but is the operator's. Driven by the `mcp`
SDK's stdio client (and its streamable HTTP client for `--http`); what is checked is where
files land on disk, what a command in the sandbox sees, the results the MCP client gets
and the journal's record of each call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from execgate.client import AsyncClient, CallRecord, Status
from tests import bridge_support as bs
from tests.daemon import Daemon
from tests.support import sandbox_serve_args

pytestmark = pytest.mark.timeout(240)

POLICY = """\
version: 1
default: deny
rules:
  - {{id: all, effect: allow, tools: ['*']}}
workspaces:
  - {{name: default, agents: [agent]}}
  - {{name: side, root: "{root}/side", agents: [agent]}}
  - {{name: theirs, root: "{root}/theirs", agents: [operator]}}
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("bridge-workspaces")
    (root / "policy.yaml").write_text(POLICY.format(root=root))
    d = Daemon(
        root / "daemon",
        "--local-identities",
        *sandbox_serve_args("bwrap", root / "daemon"),
        "--policy",
        str(root / "policy.yaml"),
    ).start(timeout=60)
    yield d
    assert d.stop() == 0


def side(daemon: Daemon) -> Path:
    return daemon.root.parent / "side"


def theirs(daemon: Daemon) -> Path:
    return daemon.root.parent / "theirs"


async def record_of(daemon: Daemon, result: types.CallToolResult) -> CallRecord:
    """The journal's record of the call behind `result`, read by the operator."""
    found = result.structured_content
    async with AsyncClient(daemon.address, token=bs.token(daemon, "operator")) as op:
        return await op.get_call(found["call_id"], run_id=found["run_id"])


def test_the_named_workspace_is_where_calls_work(daemon: Daemon) -> None:
    async def body() -> tuple[types.CallToolResult, types.CallToolResult, CallRecord]:
        async with bs.bridged(daemon, "--workspace", "side") as s:
            wrote = await s.call_tool("write_file", {"path": "notes.txt", "content": "in side"})
            # A command in the sandbox is shown that root, not the daemon's --workspace.
            saw = await s.call_tool("run_command", {"argv": ["cat", "notes.txt"]})
        return wrote, saw, await record_of(daemon, wrote)

    wrote, saw, record = anyio.run(body)
    assert wrote.is_error is False, bs.text(wrote)
    assert wrote.structured_content["evidence"]["path"] == str(side(daemon) / "notes.txt")
    assert (side(daemon) / "notes.txt").read_text() == "in side"
    assert not (daemon.workspace / "notes.txt").exists()
    assert (saw.is_error, bs.text(saw)) == (False, "in side")
    assert (record.agent, record.workspace) == ("agent", "side")


def test_without_the_option_calls_work_in_the_first(daemon: Daemon) -> None:
    async def body() -> tuple[types.CallToolResult, CallRecord]:
        async with bs.bridged(daemon) as s:
            wrote = await s.call_tool("write_file", {"path": "first.txt", "content": "first"})
        return wrote, await record_of(daemon, wrote)

    wrote, record = anyio.run(body)
    assert wrote.is_error is False, bs.text(wrote)
    assert (daemon.workspace / "first.txt").read_text() == "first"
    assert not (side(daemon) / "first.txt").exists()
    assert record.workspace == "default"


def test_over_http_the_named_workspace_too(daemon: Daemon) -> None:
    with bs.http_bridge(daemon, "--workspace", "side") as url:

        async def body() -> types.CallToolResult:
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as s,
            ):
                await s.initialize()
                return await s.call_tool("write_file", {"path": "http.txt", "content": "http"})

        wrote = anyio.run(body)
    assert wrote.is_error is False, bs.text(wrote)
    assert (side(daemon) / "http.txt").read_text() == "http"
    assert not (daemon.workspace / "http.txt").exists()


@pytest.mark.parametrize("name", ["theirs", "nowhere"])
def test_a_workspace_not_given_is_an_error_result_naming_it(daemon: Daemon, name: str) -> None:
    """Another identity's workspace and one that does not exist: the same words (names
    cannot be probed), a refusal the daemon journaled, the session still serving."""

    async def body() -> tuple[types.CallToolResult, list[str], CallRecord]:
        async with bs.bridged(daemon, "--workspace", name) as s:
            refused = await s.call_tool("write_file", {"path": "x.txt", "content": "no"})
            tools = [t.name for t in (await s.list_tools()).tools]
        return refused, tools, await record_of(daemon, refused)

    refused, tools, record = anyio.run(body)
    assert refused.is_error is True
    said = bs.text(refused)
    assert said.startswith(
        f"execgate: REJECTED (permission_denied): workspace {name!r} is not given to agent"
    ), said
    assert "\nfield: workspace\n" in said, said
    found = refused.structured_content
    assert (found["status"], found["error_class"], found["field"]) == (
        "REJECTED",
        "permission_denied",
        "workspace",
    )
    assert "write_file" in tools
    assert not (theirs(daemon) / "x.txt").exists()
    assert not (side(daemon) / "x.txt").exists()
    assert not (daemon.workspace / "x.txt").exists()
    assert record.outcome is not None
    assert (record.outcome.status, record.workspace) == (Status.REJECTED, name)
