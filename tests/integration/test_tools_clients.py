"""The Python client against a real daemon serving a declared command tool and the
fixture MCP server (in bwrap): both listed with their provider, both executed, each
with its status and result text. The TypeScript twin is
client/typescript/test/tools.test.ts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from execgate.client import Client, Status
from tests import mcp_support as ms
from tests.daemon import Daemon
from tests.support import sandbox_serve_args

pytestmark = pytest.mark.timeout(120)

POLICY = """\
version: 1
default: deny
rules:
  - {id: mine, effect: allow, tools: [shout, "faulty.*"], reason: the test's tools}
"""
SHOUT = {
    "name": "shout",
    "description": "echo the text back",
    "input_schema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
    "argv": ["echo", "{text}"],
    "effects": {},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("tools-clients")
    tag = ms.new_tag()
    command, args = ms.fixture_server()
    server = {"name": "faulty", "command": command, "args": list(args)}
    server["env"] = {"set": {ms.TAG_ENV: tag}}
    doc = {"version": 1, "tools": [SHOUT], "servers": [server]}
    (root / "tools.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (root / "policy.yaml").write_text(POLICY)
    daemon = Daemon(
        root,
        *sandbox_serve_args("bwrap", root),
        *[a for p in ms.RO_PATHS for a in ("--sandbox-ro", str(p))],
        "--policy",
        str(root / "policy.yaml"),
        "--tools",
        str(root / "tools.yaml"),
    ).start(timeout=60)
    yield daemon
    daemon.stop()
    ms.wait_for(lambda: ms.tagged(tag) == [], 10, "the MCP server gone with the daemon")


@pytest.fixture
def eg(served: Daemon) -> Iterator[Client]:
    with Client(served.address) as c:
        yield c


def test_both_listed_with_their_provider(eg: Client) -> None:
    specs = {t.name: t for t in eg.list_tools()}
    assert specs["shout"].provider == "command"
    assert specs["faulty.echo"].provider == "mcp:faulty"
    assert specs["shout"].read_only  # effects: {} declares no write
    assert specs["faulty.echo"].read_only is False  # an untrusted server's tool: a writer


def test_declared_tool_runs(eg: Client) -> None:
    o = eg.execute_one("shout", text="hello; rm -rf /")
    assert (o.status, o.text) == (Status.SUCCESS, "hello; rm -rf /\n"), o


def test_mcp_tool_runs(eg: Client) -> None:
    o = eg.execute_one("faulty.echo", text="from python")
    assert (o.status, o.text) == (Status.SUCCESS, "from python"), o


def test_mcp_tool_error_is_typed(eg: Client) -> None:
    o = eg.execute_one("faulty.fails", why="on purpose")
    assert (o.status, o.error_class) == (Status.FAILURE, "tool_error"), o
