"""A real daemon for `execgate mcp`'s tests, and how MCP clients launch the bridge.

The daemon is `make run`'s kind (`--local-identities`: an `agent` and an `operator`, their
tokens beside the socket), on bwrap, with a policy that allows, denies, asks and limits,
and a tools file that serves every kind of tool: built-ins (and the test tools), a
declared command tool, an untrusted MCP server (the fixture) and a trusted one
(server-everything, which reports progress).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import yaml
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from execgate.client import AsyncClient, CallRecord
from tests import mcp_support as ms
from tests.daemon import Daemon, reachable_workspace, scaled
from tests.support import sandbox_serve_args

POLICY = """\
version: 1
default: deny
rules:
  - id: reads
    effect: allow
    tools: [read_file, list_dir, search, noop, echo_hi]
  - id: no-secrets
    effect: deny
    paths: ["secret.txt"]
    reason: the secret stays where it is
  - id: writes
    effect: allow
    tools: [run_command, write_file, work]
  - id: ask-before-touch
    effect: ask
    tools: [run_command]
    argv_prefix: [touch]
    approvers: [approver]
    ttl: 600
    reason: a human says yes first
  - id: servers
    effect: allow
    tools: ["faulty.*", "everything.*"]
limits:
  - tools: [work]
    timeout_s: 1
    grace_s: 0.5
"""
# The console script MCP clients are configured with (README, "Use execgate from an MCP
# client"): the venv's own, as `pip install` puts it on PATH.
EXECGATE = str(Path(sys.prefix) / "bin" / "execgate")
# The MCP clients of the npm test deps (tests/fixtures/mcp/npm): the TypeScript SDK, which
# the relay bridge_client.cjs drives, and the Inspector's command line.
TS_CLIENT = ms.REPO / "tests" / "fixtures" / "mcp" / "bridge_client.cjs"
TS_SDK = ms.SCOPE / "sdk" / "package.json"
INSPECTOR_CLI = ms.NPM / "node_modules" / ".bin" / "mcp-inspector"


def tools(tag: str) -> dict[str, Any]:
    faulty_cmd, faulty_args = ms.fixture_server()
    every_cmd, every_args = ms.npm_server("server-everything")
    marker = {"set": {ms.TAG_ENV: tag}}
    return {
        "version": 1,
        "tools": [
            {
                "name": "echo_hi",
                "description": "Say hi.",
                "input_schema": {"type": "object", "properties": {}},
                "argv": ["echo", "hi"],
                "effects": {"reads": ["."]},
            }
        ],
        "servers": [
            {"name": "faulty", "command": faulty_cmd, "args": list(faulty_args), "env": marker},
            {
                "name": "everything",
                "command": every_cmd,
                "args": list(every_args),
                "env": marker,
                "trusted": True,
            },
        ],
    }


def bridge_daemon(root: Path, tag: str) -> Daemon:
    """Not started. Its workspace holds `hello.txt` and `secret.txt`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "policy.yaml").write_text(POLICY)
    (root / "tools.yaml").write_text(yaml.safe_dump(tools(tag), sort_keys=False))
    daemon = Daemon(
        root,
        "--local-identities",
        *sandbox_serve_args("bwrap", root),
        *[a for p in ms.RO_PATHS for a in ("--sandbox-ro", str(p))],
        "--policy",
        str(root / "policy.yaml"),
        "--tools",
        str(root / "tools.yaml"),
        "--grace",
        "1",
    )
    reachable_workspace(daemon.workspace)
    daemon.workspace.mkdir(parents=True, exist_ok=True)
    (daemon.workspace / "hello.txt").write_text("hello from the workspace\n")
    (daemon.workspace / "secret.txt").write_text("do not read\n")
    return daemon


@contextmanager
def served(root: Path) -> Iterator[Daemon]:
    """`bridge_daemon`, started; stopped after, with no MCP server process left."""
    tag = ms.new_tag()
    daemon = bridge_daemon(root, tag).start(timeout=60)
    try:
        yield daemon
    finally:
        daemon.stop()
    ms.wait_for(lambda: ms.tagged(tag) == [], 10, "every MCP server gone with the daemon")


def token(daemon: Daemon, name: str) -> str:
    """A local identity's token (`agent`, `operator`) from beside the daemon's socket."""
    return (daemon.state_dir / "tokens" / f"{name}.token").read_text().strip()


def bridge_env(daemon: Daemon, **extra: str) -> dict[str, str]:
    """What an MCP client's configuration gives the bridge: where the daemon is."""
    return {"EXECGATE_ADDR": daemon.address, **extra}


@asynccontextmanager
async def bridged(daemon: Daemon, *args: str, **env: str) -> AsyncIterator[ClientSession]:
    """`execgate mcp ARGS`, launched by the SDK's stdio client, initialized."""
    params = StdioServerParameters(
        command=EXECGATE, args=["mcp", *args], env=bridge_env(daemon, **env)
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextmanager
def http_bridge(daemon: Daemon, *args: str) -> Iterator[str]:
    """`execgate mcp --http 127.0.0.1:0 ARGS`; yields the URL it prints."""
    proc = subprocess.Popen(
        [EXECGATE, "mcp", "--http", "127.0.0.1:0", *args],
        env={**os.environ, **bridge_env(daemon)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"serving MCP at (http://\S+)", line)
        assert m, line + proc.stderr.read()
        yield m.group(1)
    finally:
        proc.terminate()
        proc.communicate(timeout=scaled(10))


def readme_config() -> dict[str, Any]:
    """The MCP client configuration the README shows, parsed."""
    text = (ms.REPO / "README.md").read_text()
    block = text.split("<!-- mcp-client-config -->", 1)[1].split("<!-- /mcp-client-config", 1)[0]
    return dict(json.loads(block.split("```json\n", 1)[1].split("```", 1)[0]))


def text(result: types.CallToolResult) -> str:
    """The text blocks of a tool result, joined."""
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def until(check: Callable[[], Awaitable[Any]], seconds: float, what: str) -> Any:
    """Poll the async `check` (seconds scaled for load) until it returns something truthy,
    which is returned."""
    deadline = anyio.current_time() + scaled(seconds)
    while not (found := await check()):
        if anyio.current_time() > deadline:
            raise AssertionError(f"not within {scaled(seconds):.1f}s: {what}")
        await anyio.sleep(0.05)
    return found


async def running(eg: AsyncClient, run_id: str, tool: str) -> CallRecord | None:
    """The call of `tool` in `run_id` the journal has running, if any."""
    calls = await eg.list_calls(run_id=run_id, tool=tool)
    return next((c for c in calls if c.running), None)


async def ended(eg: AsyncClient, run_id: str, tool: str) -> CallRecord | None:
    """The one call of `tool` in `run_id`, once it has its outcome."""
    [call] = await eg.list_calls(run_id=run_id, tool=tool)
    return call if call.outcome is not None else None
