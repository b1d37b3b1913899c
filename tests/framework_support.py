"""What the agent-framework tests share (tests/integration/test_integration_*.py): a real
daemon serving the framework examples' declared tools (examples/frameworks/tools.yaml),
a few of the tests' own and a real MCP server's, with identities so that a policy `ask`
can be approved;
the same tools' programs run by the framework itself (no execgate), for the lost-update
comparison; and the timeline checks both use.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from execgate.client import AsyncClient, CallNotFound, Outcome
from tests import mcp_support as ms
from tests.auth_support import write_identities
from tests.daemon import Daemon, give, scaled
from tests.loop_support import PEOPLE

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_TOOLS = REPO / "examples" / "frameworks" / "tools.yaml"
EXAMPLE_POLICY = REPO / "examples" / "frameworks" / "policy.yaml"
STR = {"type": "string", "minLength": 1}


def _command(name: str, argv: list[str], props: dict[str, Any]) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": props,
        "required": sorted(props),
        "additionalProperties": False,
    }
    return {"name": name, "description": f"{name} (test)", "input_schema": schema, "argv": argv}


# The tests' own tools, beside the examples' increment and peek.
TEST_TOOLS: list[dict[str, Any]] = [
    # Appends `tag` to a file after a pause: the order of two on one file shows.
    {
        **_command(
            "append",
            ["sh", "-c", 'sleep 0.2; printf %s "$2" >> "$1"', "append", "{path}", "{tag}"],
            {"path": STR, "tag": STR},
        ),
        "effects": {"writes": ["{path}"]},
    },
    # Runs until stopped; touches nothing.
    {**_command("slow", ["sleep", "60"], {}), "effects": {}},
    # The policy denies it / asks a person first.
    {**_command("danger", ["true"], {}), "effects": {}},
    {**_command("careful", ["echo", "carefully done"], {}), "effects": {}},
]
POLICY_RULES: list[dict[str, Any]] = [
    {"id": "no-danger", "effect": "deny", "tools": ["danger"], "reason": "never this one"},
    {
        "id": "ask-careful",
        "effect": "ask",
        "tools": ["careful"],
        "approvers": ["approver"],
        "ttl": 120,
        "reason": "a person looks first",
    },
    {"id": "tests", "effect": "allow", "tools": ["append", "slow", "write_file", "faulty.echo"]},
]
# A real MCP server (the SDK fixture): its tools are `faulty.TOOL`, a name models refuse.
SERVERS: list[dict[str, Any]] = [
    {"name": "faulty", "command": ms.fixture_server()[0], "args": list(ms.fixture_server()[1])}
]


def start_framework_daemon(root: Path) -> Daemon:
    """A daemon with the examples' tools and policy and the tests' additions, knowing
    tests.loop_support's PEOPLE (bot: agent, alice: approver, olga: operator)."""
    root.mkdir(parents=True, exist_ok=True)
    tools = yaml.safe_load(EXAMPLE_TOOLS.read_text())
    tools["tools"] += TEST_TOOLS
    tools["servers"] = SERVERS
    (root / "tools.yaml").write_text(yaml.safe_dump(tools, sort_keys=False))
    policy = yaml.safe_load(EXAMPLE_POLICY.read_text())
    policy["rules"] = POLICY_RULES + policy["rules"]
    (root / "policy.yaml").write_text(yaml.safe_dump(policy, sort_keys=False))
    identities = write_identities(root / "identities.yaml", PEOPLE)
    home = root / "daemon"
    args = ["--tools", str(root / "tools.yaml"), "--policy", str(root / "policy.yaml")]
    args += [a for p in ms.RO_PATHS for a in ("--sandbox-ro", str(p))]  # the server's Python
    return Daemon(home, *args, "--identities", str(identities)).start(timeout=60)


def counter(daemon: Daemon, name: str, value: int = 0) -> Path:
    """A counter file in the daemon's workspace, for its sandboxed commands to change:
    given to the process sandbox's run-as user, and writable by group 0, which is bwrap's
    (uid 0 without capabilities under a root daemon)."""
    path = daemon.workspace / name
    path.write_text(f"{value}\n")
    path.chmod(0o664)
    return give(path)


# ------------------------------------------------------------------ the tools, natively


def example_argv(tool: str, **arguments: str) -> list[str]:
    """The program the examples' tools file declares for `tool`, its `{name}`
    placeholders filled in: what the daemon would run, for the framework to run itself."""
    [decl] = [t for t in yaml.safe_load(EXAMPLE_TOOLS.read_text())["tools"] if t["name"] == tool]
    return [element.format(**arguments) for element in decl["argv"]]


@dataclass(frozen=True)
class Span:
    """When a natively run tool ran (time.time() seconds, the daemon's marks' clock)."""

    started: float
    finished: float
    output: str


async def run_natively(workspace: Path, tool: str, **arguments: str) -> Span:
    """The examples' `tool` run as a framework runs a local tool: a process in the
    workspace, now, with nothing to order it against the others."""
    started = time.time()
    proc = await asyncio.create_subprocess_exec(
        *example_argv(tool, **arguments),
        cwd=workspace,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out
    return Span(started, time.time(), out.decode())


# ------------------------------------------------------------------ timelines


def at(o: Outcome, phase: str) -> float:
    found = o.mark(phase)
    assert found is not None, (o.call_id, o.status, o.message, o.timeline)
    return found.at


def span(o: Outcome) -> Span:
    return Span(at(o, "started"), at(o, "finished"), o.text)


def overlap(a: Span, b: Span) -> bool:
    return a.started < b.finished and b.started < a.finished


def all_overlap(spans: list[Span]) -> bool:
    """Every span runs at one moment together with every other one."""
    return max(s.started for s in spans) < min(s.finished for s in spans)


def none_overlap(spans: list[Span]) -> bool:
    return not any(overlap(a, b) for i, a in enumerate(spans) for b in spans[i + 1 :])


async def journaled(client: AsyncClient, call_id: str, run_id: str, seconds: float = 20) -> Outcome:
    """The outcome the daemon's journal holds for a call, once it holds one (polled, for
    `seconds` scaled for load)."""
    deadline = time.monotonic() + scaled(seconds)
    while True:
        with contextlib.suppress(CallNotFound):
            record = await client.get_call(call_id, run_id=run_id)
            if record.outcome is not None:
                return record.outcome
        if time.monotonic() > deadline:
            raise AssertionError(f"no outcome of {run_id}/{call_id} within {scaled(seconds)}s")
        await asyncio.sleep(0.05)
