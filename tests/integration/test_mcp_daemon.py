"""MCP servers' tools through the real daemon: listed, validated, scheduled by their
effects, run in bwrap, stopped through the ladder, journaled; no process left, even
after the daemon is SIGKILLed."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
import yaml

from execgate.client import Call, Client, EventKind, Status, StopMode
from tests import mcp_support as ms
from tests.auth_support import write_identities
from tests.daemon import Daemon, scaled
from tests.loop_support import PEOPLE, TOKENS
from tests.support import wait_until

pytestmark = pytest.mark.timeout(180)

POLICY = """\
version: 1
default: deny
rules:
  - id: no-secrets
    effect: deny
    paths: ["**/secret.txt"]
    reason: a path the effects templates name reaches the policy
  - id: mcp-tools
    effect: allow
    tools: ["git.*", "faulty.*", "fs.*", "everything.*"]
    reason: the test's servers
"""
# The repository belongs to the run-as user; the sandbox's uid 0 must be let in.
SAFE_DIRECTORY = [
    ["GIT_CONFIG_COUNT", "1"],
    ["GIT_CONFIG_KEY_0", "safe.directory"],
    ["GIT_CONFIG_VALUE_0", "*"],
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, str]]:
    root = tmp_path_factory.mktemp("mcp-daemon")
    tag = ms.new_tag()
    ws = root / "workspace"
    servers = [
        ms.entry("git", ms.git_server(ws), tag, env=SAFE_DIRECTORY, trusted=True),
        ms.entry("faulty", ms.fixture_server(), tag),
        ms.entry(
            "fs",
            ms.npm_server("server-filesystem", str(ws)),
            tag,
            trusted=True,
            tools={
                "write_file": {"effects": {"writes": ["{path}"]}},
                "read_text_file": {"effects": {"reads": ["{path}"]}},
            },
        ),
        ms.entry("everything", ms.npm_server("server-everything"), tag, trusted=True),
    ]
    daemon = ms.mcp_daemon(root, servers, POLICY)
    from tests.daemon import reachable_workspace

    reachable_workspace(ws)
    ms.git_repo(ws)
    daemon.start(timeout=60)
    yield daemon, tag
    daemon.stop()
    ms.wait_for(lambda: ms.tagged(tag) == [], 10, "every server gone after the daemon stopped")


@pytest.fixture
def eg(served: tuple[Daemon, str]) -> Iterator[Client]:
    with Client(served[0].address) as c:
        yield c


def test_tools_listed_with_their_schemas(eg: Client) -> None:
    specs = {t.name: t for t in eg.list_tools()}
    assert {"git.git_status", "git.git_log", "faulty.echo", "fs.write_file"} <= set(specs)
    assert specs["git.git_status"].provider == "mcp:git"
    assert specs["faulty.echo"].provider == "mcp:faulty"
    assert specs["faulty.echo"].read_only is False  # untrusted: a writer
    assert "text" in specs["faulty.echo"].input_schema["properties"]


def test_git_status_and_log(eg: Client, served: tuple[Daemon, str]) -> None:
    ws = str(served[0].workspace)
    status = eg.execute_one("git.git_status", repo_path=ws)
    assert status.status is Status.SUCCESS, status
    assert "On branch main" in status.text
    log = eg.execute_one("git.git_log", repo_path=ws)
    assert "first commit" in log.text, log


def test_schema_is_checked_before_the_server(eg: Client) -> None:
    o = eg.execute_one("faulty.echo", text=5)
    assert (o.status, o.error_class) == (Status.REJECTED, "invalid_argument"), o


def test_tool_error_and_partial(eg: Client) -> None:
    failed = eg.execute_one("faulty.fails")
    assert (failed.status, failed.error_class) == (Status.FAILURE, "tool_error"), failed
    flood = eg.execute_one("faulty.flood", megabytes=2)
    assert flood.status is Status.PARTIAL, flood
    assert flood.truncated


def test_untrusted_writer_is_serialized(eg: Client, served: tuple[Daemon, str]) -> None:
    target = served[0].workspace / "lies.txt"
    calls = [
        Call(
            tool="faulty.lie_append",
            arguments={"path": str(target), "line": f"line {i}", "hold": 0.3},
        )
        for i in range(3)
    ]
    outcomes = eg.execute(calls)
    assert [o.status for o in outcomes] == [Status.SUCCESS] * 3, outcomes
    # Read, hold, write: run together, they would lose each other's lines.
    assert target.read_text().splitlines() == ["line 0", "line 1", "line 2"]


def test_writes_to_one_file_keep_proposal_order(eg: Client, served: tuple[Daemon, str]) -> None:
    path = str(served[0].workspace / "ordered.txt")
    calls = [
        Call(tool="fs.write_file", arguments={"path": path, "content": f"v{i}"}) for i in range(4)
    ]
    plans = eg.explain(calls)
    assert [len(p.waits_for) for p in plans] == [0, 1, 2, 3], plans
    outcomes = eg.execute(calls)
    assert [o.status for o in outcomes] == [Status.SUCCESS] * 4, outcomes
    assert Path(path).read_text() == "v3"


def test_reads_of_a_trusted_server_run_together(eg: Client, served: tuple[Daemon, str]) -> None:
    ws = served[0].workspace
    calls = [
        Call(tool="fs.read_text_file", arguments={"path": str(ws / "README")}),
        Call(tool="fs.read_text_file", arguments={"path": str(ws / "README")}),
        Call(tool="git.git_status", arguments={"repo_path": str(ws)}),
    ]
    plans = eg.explain(calls)
    assert [p.may_write for p in plans] == [False, False, False], plans
    assert [p.waits_for for p in plans] == [(), (), ()], plans
    outcomes = eg.execute(calls)
    assert [o.text for o in outcomes[:2]] == ["hello\n", "hello\n"], outcomes


def test_policy_sees_the_paths_of_effects_templates(eg: Client, served: tuple[Daemon, str]) -> None:
    secret = served[0].workspace / "secret.txt"
    secret.write_text("no")
    o = eg.execute_one("fs.read_text_file", path=str(secret))
    assert (o.status, o.error_class) == (Status.REJECTED, "policy_denied"), o
    escape = eg.execute_one("fs.read_text_file", path="/etc/passwd")
    assert (escape.status, escape.field) == (Status.REJECTED, "arguments.path"), escape


def test_timeout_on_a_hung_writer_is_unknown(eg: Client) -> None:
    o = eg.run(Call(tool="faulty.hang", timeout=1.0))
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "timeout"), o
    assert o.stopped_how is StopMode.COOPERATIVE, o


def test_ignored_cancel_is_forced_then_healthy(eg: Client, served: tuple[Daemon, str]) -> None:
    o = eg.run(Call(tool="faulty.ignore_cancel", timeout=1.0))
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "timeout"), o
    assert o.stopped_how is StopMode.FORCE_TERMINATED, o
    assert o.evidence.survivors == 0, o
    forced = o.mark("force_terminated")
    assert forced is not None
    again = eg.execute_one("faulty.echo", text="restarted")
    assert (again.status, again.text) == (Status.SUCCESS, "restarted"), again


def test_crash_mid_call_then_healthy(eg: Client) -> None:
    o = eg.execute_one("faulty.crash", code=9)
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "interrupted"), o
    again = eg.execute_one("faulty.echo", text="still here")
    assert (again.status, again.text) == (Status.SUCCESS, "still here"), again


LONG = "everything.trigger-long-running-operation"


def test_progress_reaches_the_stream(eg: Client) -> None:
    call = Call(tool=LONG, arguments={"duration": 1.5, "steps": 5}, call_id="long-1")
    events = list(eg.stream([call]))
    progress = [e for e in events if e.kind is EventKind.PROGRESS]
    assert len(progress) >= 2, events
    assert {e.total for e in progress} == {5.0}
    assert [e.progress for e in progress] == sorted(e.progress for e in progress)
    finished = events[-1].outcome
    assert finished is not None
    assert finished.status is Status.SUCCESS, finished


def test_long_running_cancel_ends_within_grace(eg: Client) -> None:
    call = Call(tool=LONG, arguments={"duration": 60, "steps": 120}, call_id="long-2")
    outcome = None
    for e in eg.stream([call], run_id="long-cancel"):
        if e.kind is EventKind.PROGRESS and e.progress == 1:
            eg.cancel(call_id="long-2", run_id="long-cancel", reason="enough", grace=5)
        if e.kind is EventKind.FINISHED:
            outcome = e.outcome
    assert outcome is not None
    # Trusted and readOnlyHint: a reader, so FAILURE (nothing can have changed).
    assert (outcome.status, outcome.error_class) == (Status.FAILURE, "cancelled"), outcome
    assert outcome.stopped_how is StopMode.COOPERATIVE, outcome
    asked, stopped = outcome.mark("cancel_requested"), outcome.mark("stopped")
    assert asked is not None
    assert stopped is not None
    assert stopped.at - asked.at < 5, outcome.timeline


def test_daemon_sigkill_leaves_no_server(tmp_path: Path) -> None:
    tag = ms.new_tag()
    servers = [ms.entry("faulty", ms.fixture_server(), tag, prestart=True)]
    daemon = ms.mcp_daemon(tmp_path, servers, POLICY).start(timeout=60)
    with Client(daemon.address) as eg:
        child = eg.execute_one("faulty.spawn_child")
        assert child.status is Status.SUCCESS, child
    assert len(ms.tagged(tag)) >= 2
    os.kill(daemon.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
    daemon.proc.wait(10)  # type: ignore[union-attr]
    ms.wait_for(lambda: ms.tagged(tag) == [], 10, "no server process after the daemon's SIGKILL")
    daemon.kill_group()


def test_a_reload_may_change_commands_but_not_servers(tmp_path: Path) -> None:
    """Servers start with the daemon: a reload that keeps `servers:` as they were adds
    its command tools; one that changes them is refused and the tools in force stay."""
    tag = ms.new_tag()
    servers = [ms.entry("faulty", ms.fixture_server(), tag)]
    daemon = ms.mcp_daemon(tmp_path, servers, POLICY).start(timeout=60)
    tools_yaml = tmp_path / "tools.yaml"
    try:
        with Client(daemon.address) as eg:
            doc = yaml.safe_load(tools_yaml.read_text())
            doc["tools"] = [
                {
                    "name": "hello",
                    "description": "says hello",
                    "input_schema": {"type": "object"},
                    "argv": ["echo", "hello"],
                }
            ]
            _save(tools_yaml, yaml.safe_dump(doc, sort_keys=False))
            wait_until(lambda: "hello" in _names(eg), "the new command tool", scaled(20))
            assert "faulty.echo" in _names(eg)
            doc["servers"][0]["trusted"] = True
            _save(tools_yaml, yaml.safe_dump(doc, sort_keys=False))
            wait_until(lambda: _refusals(daemon) != [], "the refused reload", scaled(20))
            assert "restart" in _refusals(daemon)[0]
            assert {"hello", "faulty.echo"} <= _names(eg)
            spec = {t.name: t for t in eg.list_tools()}["faulty.echo"]
            assert not spec.read_only  # still the untrusted server's writer
    finally:
        daemon.stop()


def _names(eg: Client) -> set[str]:
    return {t.name for t in eg.list_tools()}


def _save(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def _refusals(d: Daemon) -> list[str]:
    uri = f"file:{d.state_dir / 'journal.db'}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as conn:
        rows = conn.execute("SELECT accepted, message FROM policy_events ORDER BY seq").fetchall()
    return [message for accepted, message in rows if not accepted]


ASK_POLICY = """\
version: 1
default: deny
rules:
  - id: ask-echo
    effect: ask
    tools: ["faulty.echo"]
    approvers: [approver]
    reason: a human looks at what the server is sent
  - id: mcp-tools
    effect: allow
    tools: ["faulty.*"]
"""


def test_a_policy_ask_parks_an_mcp_tool_until_an_approver_says_yes(tmp_path: Path) -> None:
    """`ask` on `SERVER.TOOL` works as on the built-ins: the call waits parked under the
    rule that asked, and the approver's word lets it run through the server."""
    tag = ms.new_tag()
    daemon = ms.mcp_daemon(tmp_path, [ms.entry("faulty", ms.fixture_server(), tag)], POLICY)
    (tmp_path / "policy.yaml").write_text(ASK_POLICY)
    identities = write_identities(tmp_path / "identities.yaml", PEOPLE)
    daemon.extra_args = (*daemon.extra_args, "--identities", str(identities))
    daemon.start(timeout=60)
    try:
        with Client(daemon.address, token=TOKENS["bot"]) as bot:
            call = Call(tool="faulty.echo", arguments={"text": "hello"}, call_id="asked")
            stream = bot.stream([call], timeout=scaled(60))
            parked = next(e for e in stream if e.kind is EventKind.AWAITING_APPROVAL)
            assert parked.rule_id == "ask-echo"
            with Client(daemon.address, token=TOKENS["alice"]) as alice:
                alice.approve(parked.approval_id, "fine")
            final = [e for e in stream if e.kind is EventKind.FINISHED][-1].outcome
            assert final is not None
            assert final.status is Status.SUCCESS, (final.error_class, final.message)
            assert "hello" in final.text
    finally:
        daemon.stop()
