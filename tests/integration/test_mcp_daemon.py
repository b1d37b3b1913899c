"""MCP servers' tools through the real daemon: listed, validated, scheduled by their
effects, run in bwrap, stopped through the ladder, journaled; no process left, even
after the daemon is SIGKILLed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
import yaml
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from execgate.client import Call, Client, EventKind, Status, StopMode
from tests import mcp_support as ms
from tests.auth_support import write_identities
from tests.daemon import Daemon, scaled
from tests.loop_support import PEOPLE, TOKENS
from tests.support import Streamer, wait_until

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
        # `nap` is a reader by the operator's word (the server is untrusted).
        ms.entry("faulty", ms.fixture_server(), tag, tools={"nap": {"read_only": True}}),
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


def test_timeout_on_a_hung_writer_is_unknown_and_forced(eg: Client) -> None:
    """The SDK cancels `hang`'s handler, and answers nothing (the spec says not to): for a
    writer nothing then proves that its work ended, so its server is killed."""
    o = eg.run(Call(tool="faulty.hang", timeout=1.0))
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "timeout"), o
    assert o.stopped_how is StopMode.FORCE_TERMINATED, o
    expired = o.mark("grace_expired")
    assert expired is not None
    assert expired.detail == "after 1s without an answer", o.timeline


def test_a_cancelled_reader_stops_cooperatively(eg: Client) -> None:
    """The SDK's normal handler (an await, cancelled on receipt) of a reader: a ping
    answered within the grace is enough, and the server goes on."""
    warm = eg.execute_one("faulty.echo", text="up")  # a killed server starts again first
    assert warm.status is Status.SUCCESS, warm
    restarts = _restarts(eg, "mcp:faulty")
    o = eg.run(Call(tool="faulty.nap", timeout=1.0))
    assert (o.status, o.error_class) == (Status.FAILURE, "timeout"), o
    assert o.stopped_how is StopMode.COOPERATIVE, o
    stopped = o.mark("stopped")
    assert stopped is not None
    assert "answered a ping" in stopped.detail, o.timeline
    assert _restarts(eg, "mcp:faulty") == restarts


def test_a_writer_answered_after_its_cancel_stops_cooperatively(
    eg: Client, served: tuple[Daemon, str]
) -> None:
    """`ignore_cancel` blocks the server's loop, then answers: the answer comes after the
    cancel (the SDK no longer waits for it) and is the proof that the work ended."""
    assert eg.execute_one("faulty.echo", text="up").status is Status.SUCCESS
    restarts = _restarts(eg, "mcp:faulty")
    block, started = scaled(2.0), served[0].workspace / "blocking"
    args = {"seconds": block, "started": str(started)}
    call = Call(tool="faulty.ignore_cancel", arguments=args, call_id="answered")
    streamer = Streamer(served[0].address, [call], run_id="answered-late")
    wait_until(started.exists, "the block", scaled(15))  # the cancel comes in it
    eg.cancel(call_id="answered", run_id="answered-late", grace=block + scaled(10))
    streamer.join(scaled(30))
    o = streamer.outcome("answered")
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled"), o
    assert o.stopped_how is StopMode.COOPERATIVE, o
    stopped = o.mark("stopped")
    assert stopped is not None
    assert "answered the request" in stopped.detail, o.timeline
    assert _restarts(eg, "mcp:faulty") == restarts


def test_a_writer_that_ignores_its_cancel_is_killed_before_its_outcome(
    eg: Client, served: tuple[Daemon, str]
) -> None:
    """`stubborn_append` writes from a worker thread its cancellation cannot stop, while
    the server answers pings. Taken for cooperative, its locks would be released with
    the write still going: it must be force-terminated, and write nothing after."""
    daemon = served[0]
    target = daemon.workspace / "stubborn.txt"
    restarts = _restarts(eg, "mcp:faulty")
    call = Call(tool="faulty.stubborn_append", arguments={"path": str(target)}, call_id="stub")
    streamer = Streamer(daemon.address, [call], run_id="stubborn")
    wait_until(lambda: _lines(target) >= 3, "the writer writes", scaled(15))
    eg.cancel(call_id="stub", run_id="stubborn", reason="enough", grace=1.0)
    streamer.join(scaled(30))
    written = _lines(target)  # the outcome is recorded (and reported) by now
    o = streamer.outcome("stub")
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled"), o
    assert o.stopped_how is StopMode.FORCE_TERMINATED, o
    assert o.evidence.survivors == 0, o
    expired = o.mark("grace_expired")
    assert expired is not None
    assert expired.detail == "after 1s without an answer", o.timeline
    # A later call works, on a server started anew (which takes far longer than the
    # writer's 20 ms between lines): the old writer wrote nothing meanwhile.
    again = eg.execute_one("faulty.echo", text="after")
    assert (again.status, again.text) == (Status.SUCCESS, "after"), again
    assert _restarts(eg, "mcp:faulty") == restarts + 1
    assert _lines(target) == written, "the file grew after the outcome"
    lines = target.read_text().splitlines()
    assert lines == [str(i) for i in range(1, written + 1)], "one writer, never two"


CALLER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN = 0xB7AD6B7169203331


@pytest.mark.parametrize("caller", ["none", "sampled", "unsampled"])
def test_the_server_gets_the_calls_trace_context(
    eg: Client, served: tuple[Daemon, str], caller: str
) -> None:
    """The `_meta.traceparent` the server receives: the call's trace, and as parent the
    call's `execgate.sandbox.run` span as the journal records it (sampled calls), with or
    without the caller's trace context in the Execute request."""
    run_id = f"traced-{caller}"
    with _caller_context(caller):
        o = eg.run(Call(tool="faulty.trace_meta", call_id="t"), run_id=run_id)
    assert o.status is Status.SUCCESS, o
    version, trace_id, parent_id, flags = json.loads(o.text)["traceparent"].split("-")
    assert version == "00"
    if caller == "unsampled":  # the decision is passed on; nothing is recorded
        assert (trace_id, flags) == (f"{CALLER_TRACE:032x}", "00")
        return
    assert int(flags, 16) & 1, flags  # sampled (0x02: a random trace id, when the daemon's)
    spans = _call_spans(served[0], run_id, "t")
    assert trace_id == spans["execgate.call"][0], spans
    assert parent_id == spans["execgate.sandbox.run"][1], spans
    if caller == "sampled":
        assert trace_id == f"{CALLER_TRACE:032x}"


def _caller_context(caller: str) -> contextlib.AbstractContextManager[object]:
    """The caller's current span, as the client's interceptor sends it (none: nothing)."""
    if caller == "none":
        return contextlib.nullcontext()
    flags = TraceFlags(TraceFlags.SAMPLED if caller == "sampled" else TraceFlags.DEFAULT)
    span = NonRecordingSpan(SpanContext(CALLER_TRACE, CALLER_SPAN, False, flags))
    return trace.use_span(span)


def _call_spans(daemon: Daemon, run_id: str, call_id: str) -> dict[str, tuple[str, str]]:
    """The journal's spans of one call: name -> (trace id, span id); waits for the
    exporter (it writes every 500 ms)."""
    found: dict[str, tuple[str, str]] = {}

    def read() -> bool:
        journal = f"file:{daemon.state_dir / 'journal.db'}?mode=ro"
        with closing(sqlite3.connect(journal, uri=True)) as db:
            rows = db.execute(
                "SELECT s.name, s.trace_id, s.span_id FROM spans c JOIN spans s"
                " ON s.span_id = c.span_id OR s.parent_id = c.span_id"
                " WHERE c.run_id = ? AND c.call_id = ? AND c.name = 'execgate.call'",
                (run_id, call_id),
            ).fetchall()
        found.update((name, (t, sid)) for name, t, sid in rows)
        return "execgate.sandbox.run" in found

    wait_until(read, f"the spans of {run_id}/{call_id}", scaled(15))
    return found


def _restarts(eg: Client, provider: str) -> int:
    (status,) = [p for p in eg.list_providers() if p.provider == provider]
    return status.restarts


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


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
