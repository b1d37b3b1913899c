"""Traces across client and daemon, through a real OTLP receiver on loopback.

One run (the `execgate demo` script: concurrent reads, two writes to one file, an
approval, a SIGTERM-ignoring command force-terminated) is driven by a client process
whose own OpenTelemetry SDK exports to the receiver; the daemon exports there too
(OTEL_* variables) and to its journal. The test checks one trace from the client's
run span down to each call's lock wait, approval wait and sandbox run, the cancel
ladder's events in order, and that every span agrees with the journal's timeline.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import context
from opentelemetry.propagate import extract

from execgate.client import AsyncClient, Call, Client, Status
from execgate.executor.cli.demo import POLICY, _identities
from execgate.executor.policy.identity import new_token
from tests.daemon import Daemon
from tests.otlp_support import ReceivedSpan, Receiver, start_receiver, start_receivers
from tests.support import wait_until

CLIENT = textwrap.dedent(
    """
    import json, sys, threading
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from execgate.client import Client, Loop
    from execgate.executor.cli.demo import _script

    address, agent, approver, endpoint = sys.argv[1:5]
    provider = TracerProvider(resource=Resource.create({"service.name": "test-agent"}))
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    def approve():
        with Client(address, token=approver) as human:
            for a in human.watch_approvals():
                if a.state.value == "pending":
                    human.approve(a.approval_id, "fine")
                    return

    threading.Thread(target=approve, daemon=True).start()
    with Client(address, token=agent) as eg:
        result = Loop(eg, _script(), limits={"max_steps": 10}).run("traced")
    provider.shutdown()
    print(json.dumps({"run_id": result.run_id, "state": result.state.value}))
    """
)


@pytest.fixture(scope="module")
def otlp() -> Iterator[tuple[Receiver, int]]:
    server, receiver, port = start_receiver()
    yield receiver, port
    server.stop(0)


def _traced_daemon(root: Path, endpoint: str, agent: str, approver: str) -> Daemon:
    root.mkdir(parents=True, exist_ok=True)
    (root / "identities.yaml").write_text(_identities(agent, approver, new_token()))
    (root / "policy.yaml").write_text(POLICY)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    d = Daemon(
        root,
        "--identities", str(root / "identities.yaml"),
        "--policy", str(root / "policy.yaml"),
        "--sandbox", "process",
        env=env,
    )  # fmt: skip
    d.start()
    for name, text in (("a.txt", "alpha\n"), ("b.txt", "beta\n")):
        (d.workspace / name).write_text(text)
    return d


@pytest.fixture(scope="module")
def traced_run(
    tmp_path_factory: pytest.TempPathFactory, otlp: tuple[Receiver, int]
) -> Iterator[tuple[Receiver, Daemon, str]]:
    receiver, port = otlp
    endpoint = f"http://127.0.0.1:{port}"
    agent, approver = new_token(), new_token()
    daemon = _traced_daemon(tmp_path_factory.mktemp("traced"), endpoint, agent, approver)
    try:
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, daemon.address, agent, approver, endpoint],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["state"] == "completed"
        # The daemon's batch processor exports every 50 ms: wait for its last call span.
        wait_until(lambda: len(receiver.named("execgate.call", "execgate")) >= 6, "call spans")
        yield receiver, daemon, out["run_id"]
    finally:
        daemon.stop()


def _one(spans: list[ReceivedSpan]) -> ReceivedSpan:
    assert len(spans) == 1, spans
    return spans[0]


def _call_span(receiver: Receiver, run_id: str, call_id: str) -> ReceivedSpan:
    return _one(
        [
            s
            for s in receiver.named("execgate.call", "execgate")
            if s.attributes.get("execgate.call_id") == call_id
            and s.attributes.get("execgate.run_id") == run_id
        ]
    )


def _children(receiver: Receiver, parent: ReceivedSpan, name: str) -> list[ReceivedSpan]:
    return [s for s in receiver.named(name) if s.parent_id == parent.span_id]


def test_one_trace_runs_from_the_loop_through_the_daemon(
    traced_run: tuple[Receiver, Daemon, str],
) -> None:
    receiver, _, run_id = traced_run
    run = _one(receiver.named("execgate.run", "test-agent"))
    assert run.attributes["execgate.run_id"] == run_id
    assert run.attributes["execgate.run.state"] == "completed"
    batches = _children(receiver, run, "execgate.tool_batch")
    assert len(batches) == 4  # reads, writes, the approved call, the killed call
    models = _children(receiver, run, "execgate.model_request")
    assert len(models) == 5
    for tool_batch in batches:
        # W3C trace context crossed the gRPC metadata: the daemon's batch span is a child.
        (daemon_batch,) = _children(receiver, tool_batch, "execgate.batch")
        assert daemon_batch.service == "execgate"
        assert daemon_batch.trace_id == run.trace_id
        assert daemon_batch.attributes["execgate.run_id"] == run_id
        calls = _children(receiver, daemon_batch, "execgate.call")
        assert len(calls) == daemon_batch.attributes["execgate.batch.calls"]
    assert {
        s.trace_id for s in receiver.spans if s.attributes.get("execgate.run_id") == run_id
    } == {run.trace_id}


def test_reads_overlap_and_the_second_write_waited_for_the_first(
    traced_run: tuple[Receiver, Daemon, str],
) -> None:
    receiver, _, run_id = traced_run
    first, second = (_call_span(receiver, run_id, f"s1c{i}") for i in (1, 2))
    assert not _children(receiver, first, "execgate.lock_wait")
    assert not _children(receiver, second, "execgate.lock_wait")
    w1, w2 = (_call_span(receiver, run_id, f"s2c{i}") for i in (1, 2))
    (wait,) = _children(receiver, w2, "execgate.lock_wait")
    assert wait.attributes["execgate.lock.blocked_by"].endswith(f"{run_id}/s2c1")
    (ran_first,) = _children(receiver, w1, "execgate.sandbox.run")
    (ran_second,) = _children(receiver, w2, "execgate.sandbox.run")
    assert ran_second.start_ns >= ran_first.end_ns  # serialized, in proposal order
    # A command may write anywhere in the workspace: it claims it (and its cwd) for writing.
    assert set(w1.attributes["execgate.resource.modes"]) == {"write"}
    assert "workspace" in w1.attributes["execgate.resource.keys"]
    assert w1.attributes["execgate.policy.rule_ids"] == ["demo-commands"]


def test_the_approval_wait_and_the_forced_kill_are_in_the_trace(
    traced_run: tuple[Receiver, Daemon, str],
) -> None:
    receiver, daemon, run_id = traced_run
    approved = _call_span(receiver, run_id, "s3c1")
    (wait,) = _children(receiver, approved, "execgate.approval_wait")
    assert wait.attributes["execgate.approval.state"] == "approved"
    assert wait.attributes["execgate.approval.decided_by"] == "demo-approver"
    assert wait.attributes["execgate.approval.rule_id"] == "publish-needs-a-human"
    (ran,) = _children(receiver, approved, "execgate.sandbox.run")
    assert ran.start_ns >= wait.end_ns

    killed = _call_span(receiver, run_id, "s4c1")
    names = [name for name, _, _ in killed.events]
    assert names == [
        "execgate.cancel_requested",
        "execgate.signal_sent",
        "execgate.grace_expired",
        "execgate.force_terminated",
        "execgate.stopped",
    ]
    times = [at for _, at, _ in killed.events]
    assert times == sorted(times)
    assert killed.attributes["execgate.stopped_how"] == "force_terminated"
    assert killed.attributes["error.type"] == "timeout"
    assert killed.status_code == 2  # STATUS_CODE_ERROR
    # The same moments as the journal's timeline, to the nanosecond it was rounded to.
    marks = _journal_marks(daemon, run_id, "s4c1")
    for (_, at, _), phase in zip(killed.events, names, strict=True):
        assert at == int(marks[phase.removeprefix("execgate.")] * 1e9)
    (sandbox,) = _children(receiver, killed, "execgate.sandbox.run")
    assert sandbox.start_ns == int(marks["started"] * 1e9)
    assert sandbox.end_ns == int(marks["stopped"] * 1e9)
    assert sandbox.attributes["execgate.sandbox.backend"] == "process"


def test_the_journal_has_the_same_spans(traced_run: tuple[Receiver, Daemon, str]) -> None:
    receiver, daemon, _ = traced_run
    conn = sqlite3.connect(f"file:{daemon.state_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT span_id, name FROM spans WHERE trace_id = ?",
            (_one(receiver.named("execgate.run")).trace_id,),
        ).fetchall()
    finally:
        conn.close()
    exported = {s.span_id for s in receiver.spans if s.service == "execgate"}
    assert {span_id for span_id, _ in rows} == exported
    assert {name for _, name in rows} >= {
        "execgate.batch",
        "execgate.call",
        "execgate.policy",
        "execgate.lock_wait",
        "execgate.approval_wait",
        "execgate.sandbox.run",
    }


def test_a_collector_that_is_down_costs_calls_nothing(tmp_path: Path) -> None:
    """OTLP to a closed port: every call still succeeds, and its spans reach the journal."""
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    daemon = Daemon(
        tmp_path,
        "--sandbox", "process",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": dead, "OTEL_BSP_SCHEDULE_DELAY": "50"},
    )  # fmt: skip
    daemon.start()
    try:
        with Client(daemon.address) as eg:
            outcomes = eg.execute(
                [Call(tool="noop", call_id=f"n{i}") for i in range(20)], run_id="dead-collector"
            )
        assert [o.status for o in outcomes] == [Status.SUCCESS] * 20
    finally:
        assert daemon.stop() == 0
    conn = sqlite3.connect(daemon.state_dir / "journal.db")
    try:
        names = conn.execute(
            "SELECT call_id FROM spans WHERE run_id = 'dead-collector' AND name = 'execgate.call'"
        ).fetchall()
    finally:
        conn.close()
    assert sorted(n for (n,) in names) == sorted(f"n{i}" for i in range(20))


def _journal_marks(daemon: Daemon, run_id: str, call_id: str) -> dict[str, float]:
    conn = sqlite3.connect(f"file:{daemon.state_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        (outcome_json,) = conn.execute(
            "SELECT outcome_json FROM calls WHERE run_id = ? AND call_id = ?", (run_id, call_id)
        ).fetchone()
    finally:
        conn.close()
    return {phase: at for phase, at, _ in json.loads(outcome_json)["timeline"]}


def test_metrics_reach_an_otlp_receiver(tmp_path: Path) -> None:
    server, _, metrics, port = start_receivers()
    root = tmp_path / "d"
    root.mkdir()
    (root / "policy.yaml").write_text(POLICY)
    daemon = Daemon(
        root,
        "--policy", str(root / "policy.yaml"),
        "--sandbox", "process",
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_METRIC_EXPORT_INTERVAL": "100",
        },
    )  # fmt: skip
    daemon.start()
    try:
        (daemon.workspace / "a.txt").write_text("alpha\n")
        stubborn = ["sh", "-c", "trap '' TERM; sleep 30"]
        append = ["sh", "-c", "echo x >> n.txt; sleep 0.2"]
        with Client(daemon.address) as eg:
            outcomes = eg.execute(
                [
                    Call(tool="read_file", arguments={"path": "a.txt"}),
                    Call(tool="read_file", arguments={"path": "missing.txt"}),
                    Call(tool="run_command", arguments={"argv": append}),
                    Call(tool="run_command", arguments={"argv": append}),
                    Call(tool="run_command", arguments={"argv": stubborn}),
                ],
                run_id="metered",
            )
        assert outcomes[4].stopped_how.value == "force_terminated"

        def has(name: str, want: float, **attrs: str) -> bool:
            return any(
                v >= want and all(a.get(k) == x for k, x in attrs.items())
                for a, v in metrics.latest(name)
            )

        wait_until(lambda: has("execgate.forced_terminations", 1), "forced terminations")
        wait_until(lambda: has("execgate.call.lock_wait", 2, **{"execgate.tool": "run_command"}),
                   "lock waits")  # fmt: skip
        assert has("execgate.calls", 1, **{"execgate.outcome.status": "success"})
        assert has("execgate.calls", 1, **{"error.type": "not_found"})
        assert has("execgate.call.duration", 1, **{"execgate.tool": "run_command"})
        assert metrics.latest("execgate.queue.depth")
        assert metrics.latest("execgate.approvals.pending")
    finally:
        daemon.stop()
        server.stop(0)


def test_the_async_clients_calls_carry_the_trace_context(tmp_path: Path) -> None:
    """Both kinds of RPC of the asyncio client (the Execute stream, the unary
    ExecuteBatch) join the caller's trace: its spans' trace in the daemon's journal."""
    trace_id = secrets.token_hex(16)
    caller = extract({"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})

    async def calls(address: str) -> None:
        token = context.attach(caller)
        try:
            async with AsyncClient(address) as eg:
                async for _ in eg.stream([Call(tool="noop", call_id="streamed")], progress=False):
                    pass
                await eg.execute([Call(tool="noop", call_id="unary")])
        finally:
            context.detach(token)

    daemon = Daemon(tmp_path).start()
    try:
        asyncio.run(calls(daemon.address))
    finally:
        daemon.stop()  # flushes its spans into the journal
    conn = sqlite3.connect(f"file:{daemon.state_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT call_id, trace_id FROM spans WHERE call_id != ''").fetchall()
    finally:
        conn.close()
    assert {call for call, _ in rows} == {"streamed", "unary"}
    assert {trace for _, trace in rows} == {trace_id}
