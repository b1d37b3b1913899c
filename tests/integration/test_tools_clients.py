"""The Python client against a real daemon serving a declared command tool and the
fixture MCP server (in bwrap): both listed with their provider, both executed, each
with its status and result text. The TypeScript twin is
client/typescript/test/tools.test.ts.

Beside them a server that cannot start (`broken`): ListProviders, `execgate doctor`
and `execgate tools list` show each server's state and each tool's trust."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from execgate.client import Client, Status
from tests import mcp_support as ms
from tests.daemon import Daemon, scaled
from tests.support import sandbox_serve_args

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

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
BROKEN = "import sys; print('no config here', file=sys.stderr); sys.exit(3)"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("tools-clients")
    tag = ms.new_tag()
    command, args = ms.fixture_server()
    env = {"set": {ms.TAG_ENV: tag}}
    # prestart: its process stays up from the daemon's start (doctor: running).
    server = {"name": "faulty", "command": command, "args": list(args), "env": env}
    server["prestart"] = True
    broken = {"name": "broken", "command": command, "args": ["-c", BROKEN], "env": env}
    doc = {"version": 1, "tools": [SHOUT], "servers": [server, broken]}
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


def test_providers_show_running_and_failed(eg: Client) -> None:
    found = {p.provider: p for p in eg.list_providers()}
    assert set(found) == {"mcp:faulty", "mcp:broken"}
    faulty, broken = found["mcp:faulty"], found["mcp:broken"]
    assert (faulty.running, faulty.last_error) == (1, ""), faulty
    assert faulty.tools >= 8, faulty
    assert (broken.running, broken.tools) == (0, 0), broken
    assert broken.last_error, broken


def execgate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"COLUMNS": "240", "NO_COLOR": "1", "PATH": "/usr/local/bin:/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_doctor_shows_each_server(served: Daemon, tmp_path: Path) -> None:
    where = ("--addr", served.address, "--sandbox", "bwrap", "--state-dir", str(tmp_path))
    done = execgate("doctor", *where, "--json")
    # The broken server is something to fix: exit 1, as for a sandbox that fails.
    assert done.returncode == 1, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    states = {s["provider"]: s for s in report["mcp_servers"]}
    assert states["mcp:faulty"]["state"] == "running", states
    assert states["mcp:broken"]["state"] == "failed", states
    assert states["mcp:broken"]["last_error"], states
    text = execgate("doctor", *where).stdout
    assert "mcp:faulty  running" in text, text
    line = next(x for x in text.splitlines() if "mcp:broken" in x)
    assert line.split()[1] == "failed", text
    assert "last error: " in line, text


def test_doctor_names_an_unreachable_daemon(tmp_path: Path) -> None:
    gone = f"unix:{tmp_path / 'none.sock'}"
    done = execgate("doctor", "--addr", gone, "--sandbox", "process", "--state-dir", str(tmp_path))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "mcp servers: cannot ask the daemon" in done.stdout, done.stdout


def test_tools_list_shows_provider_effects_and_trust(served: Daemon) -> None:
    listed = json.loads(execgate("tools", "list", "--addr", served.address, "--json").stdout)
    by_name = {t["name"]: t for t in listed}
    assert (by_name["shout"]["provider"], by_name["shout"]["annotations_trusted"]) == (
        "command",
        True,
    )
    echo = by_name["faulty.echo"]
    assert (echo["provider"], echo["read_only"], echo["annotations_trusted"]) == (
        "mcp:faulty",
        False,
        False,
    )
    table = execgate("tools", "list", "--addr", served.address).stdout
    row = next(x for x in table.splitlines() if "faulty.echo" in x)
    assert {"mcp:faulty", "writes", "no"} <= set(row.replace(",", " ").split()), table
    row = next(x for x in table.splitlines() if "shout" in x)
    assert {"command", "read-only", "yes"} <= set(row.split()), table


AGENT = REPO / "client" / "typescript" / "dist" / "test" / "support" / "tools-agent.js"


def test_the_typescript_client_sees_the_same(served: Daemon) -> None:
    """The same daemon through the TypeScript client (needs it built: `make test-ts`)."""
    node = shutil.which("node")
    if node is None or not AGENT.exists():
        pytest.fail(f"needs node and the built TypeScript client ({AGENT}): run `make test-ts`")
    done = subprocess.run(
        [node, str(AGENT), "--addr", served.address],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert (seen["providers"]["shout"], seen["providers"]["faulty.echo"]) == (
        "command",
        "mcp:faulty",
    )
    assert seen["outcomes"] == [
        {"status": "success", "text": "from node\n"},
        {"status": "success", "text": "from node"},
    ]
    assert {"provider": "mcp:faulty", "running": 1} in seen["servers"], seen
