"""A table of malformed requests, each through a real daemon: a typed refusal naming
its class and field.

An envelope the daemon cannot use is answered INVALID_ARGUMENT, with the class
(`undecodable`, `invalid_utf8`, `out_of_range`, `bad_page_token`, `unknown_enum`,
`too_deep`, `too_large`, `missing`) and the offending field in the trailing metadata
(`execgate-error-class`, `execgate-field`) and the field in the details. A bad call
*inside* a batch stays an Outcome (REJECTED naming the field), as every bad call does.
The daemon logs one line per refusal, never a traceback.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.message import Message

from execgate.client import Call, Client, Status
from execgate.v1 import executor_pb2 as pb
from execgate.v1 import runs_pb2 as rpb
from tests.daemon import Daemon
from tests.security.rawrpc import METHODS, RawClient, module_daemon

MARK = "MARKMARK"
BAD_UTF8 = b"\xff\xfeMARK\xc3\x28"  # same length as MARK: the length prefixes still hold
MAX_TS = 253402300799  # 9999-12-31T23:59:59Z
MAX_DUR = 315576000000

EXECUTOR = "/execgate.v1.Executor/"
RUNS = "/execgate.v1.Runs/"
APPROVALS = "/execgate.v1.Approvals/"


def bad_utf8(msg: Message) -> bytes:
    """`msg` serialized with its MARK string made invalid UTF-8 (length unchanged)."""
    data = msg.SerializeToString()
    assert data.count(MARK.encode()) == 1
    return data.replace(MARK.encode(), BAD_UTF8)


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    request: bytes | Message
    field: str
    error_class: str


def _undecodable() -> list[Case]:
    """Every method but Health's, with bytes no message decodes from."""
    cases = []
    for method in sorted(METHODS):
        if method.startswith("/grpc.health"):
            continue
        short = method.rpartition("/")[2]
        cases.append(Case(f"undecodable-{short}", method, b"\x0a\x05ab", "", "undecodable"))
        cases.append(Case(f"bad-varint-{short}", method, b"\x08" + b"\xff" * 11, "", "undecodable"))
    return cases


def _utf8() -> list[Case]:
    x = EXECUTOR
    return [
        Case("utf8-call-id", x + "GetCall", bad_utf8(pb.GetCallRequest(call_id=MARK)), "call_id",
             "invalid_utf8"),
        Case("utf8-run-id", x + "Execute", bad_utf8(pb.ExecuteRequest(run_id=MARK)), "run_id",
             "invalid_utf8"),
        Case("utf8-tool", x + "ExecuteBatch",
             bad_utf8(pb.ExecuteRequest(calls=[pb.ToolCall(), pb.ToolCall(tool=MARK)])),
             "calls[1].tool", "invalid_utf8"),
        Case("utf8-arguments", x + "Explain",
             bad_utf8(pb.ExecuteRequest(calls=[pb.ToolCall(tool="noop", arguments_json=MARK)])),
             "calls[0].arguments_json", "invalid_utf8"),
        Case("utf8-page-token", x + "ListCalls", bad_utf8(pb.ListCallsRequest(page_token=MARK)),
             "page_token", "invalid_utf8"),
        Case("utf8-cancel-reason", x + "Cancel",
             bad_utf8(pb.CancelRequest(call_id="c", reason=MARK)), "reason", "invalid_utf8"),
        Case("utf8-goal", RUNS + "StartRun", bad_utf8(rpb.StartRunRequest(goal=MARK)), "goal",
             "invalid_utf8"),
        Case("utf8-label", RUNS + "StartRun", bad_utf8(rpb.StartRunRequest(labels={"k": MARK})),
             "labels[0].value", "invalid_utf8"),
        Case("utf8-data-json", RUNS + "AppendEvents",
             bad_utf8(rpb.AppendEventsRequest(run_id="r", events=[rpb.RunEvent(data_json=MARK)])),
             "events[0].data_json", "invalid_utf8"),
        Case("utf8-states", RUNS + "ListRuns", bad_utf8(rpb.ListRunsRequest(states=["a", MARK])),
             "states[1]", "invalid_utf8"),
        Case("utf8-comment", APPROVALS + "Decide",
             bad_utf8(pb.DecideRequest(approval_id="a", comment=MARK)), "comment", "invalid_utf8"),
        Case("utf8-step-tool", RUNS + "StepBatch",
             bad_utf8(rpb.StepRequest(run_id="r", calls=[pb.ToolCall(tool=MARK)])),
             "calls[0].tool", "invalid_utf8"),
        Case("utf8-step-data-json", RUNS + "Step",
             bad_utf8(rpb.StepRequest(run_id="r", events=[rpb.RunEvent(data_json=MARK)])),
             "events[0].data_json", "invalid_utf8"),
    ]  # fmt: skip


def _execute(**ts: object) -> pb.ExecuteRequest:
    return pb.ExecuteRequest(calls=[pb.ToolCall(tool="noop")], **ts)  # type: ignore[arg-type]


def _event(**at: int) -> rpb.AppendEventsRequest:
    return rpb.AppendEventsRequest(
        run_id="r",
        events=[rpb.RunEvent(seq=1, from_state="created", to_state="requesting_model", at=at)],
    )


def _step(**fields: object) -> rpb.StepRequest:
    """A Step whose envelope is whole but for what `fields` break."""
    request = rpb.StepRequest(
        run_id="r",
        events=[rpb.RunEvent(seq=1, from_state="validating", to_state="running_tools")],
        calls=[pb.ToolCall(tool="noop", call_id="c1", idempotency_key="k1")],
    )
    for name, value in fields.items():
        if name == "at":  # set raw: FromSeconds refuses what the daemon must refuse
            request.events[0].at.seconds = value  # type: ignore[assignment]
        elif name == "deadline":
            request.deadline.seconds = value  # type: ignore[assignment]
        elif name == "data_json":
            request.events[0].data_json = value  # type: ignore[assignment]
        else:
            setattr(request.calls[0], name, value)
    return request


def _limits(**values: float) -> rpb.StartRunRequest:
    return rpb.StartRunRequest(limits=rpb.RunLimits(**values))  # type: ignore[arg-type]


def _times() -> list[Case]:
    x, r, o = EXECUTOR, RUNS, "out_of_range"
    nan, inf = float("nan"), float("inf")
    return [
        Case("deadline-negative", x + "Execute", _execute(deadline={"seconds": -1}), "deadline", o),
        Case("deadline-year-10000", x + "ExecuteBatch",
             _execute(deadline={"seconds": MAX_TS + 1}), "deadline", o),
        Case("deadline-huge", x + "Execute", _execute(deadline={"seconds": 2**62}), "deadline", o),
        Case("deadline-nanos-negative", x + "Execute",
             _execute(deadline={"seconds": 5, "nanos": -1}), "deadline", o),
        Case("deadline-nanos-1e9", x + "ExecuteBatch",
             _execute(deadline={"seconds": 5, "nanos": 10**9}), "deadline", o),
        Case("timeout-negative", x + "ExecuteBatch",
             pb.ExecuteRequest(calls=[pb.ToolCall(tool="noop", timeout={"seconds": -3})]),
             "calls[0].timeout", o),
        Case("timeout-beyond-range", x + "Execute",
             pb.ExecuteRequest(calls=[pb.ToolCall(tool="noop", timeout={"seconds": MAX_DUR + 1})]),
             "calls[0].timeout", o),
        Case("timeout-sign-mismatch", x + "Explain",
             pb.ExecuteRequest(calls=[pb.ToolCall(timeout={"seconds": 1, "nanos": -5})]),
             "calls[0].timeout", o),
        Case("grace-nanos-out-of-range", x + "Cancel",
             pb.CancelRequest(call_id="c", grace={"nanos": 2 * 10**9}), "grace", o),
        Case("grace-huge", x + "Cancel",
             pb.CancelRequest(call_id="c", grace={"seconds": 2**60}), "grace", o),
        Case("since-negative", x + "ListCalls", pb.ListCallsRequest(since={"seconds": -10}),
             "since", o),
        Case("since-year-10000", x + "ListCalls",
             pb.ListCallsRequest(since={"seconds": MAX_TS + 1}), "since", o),
        Case("until-nanos", x + "ListCalls",
             pb.ListCallsRequest(until={"seconds": 1, "nanos": 10**9 + 7}), "until", o),
        Case("event-at-negative", r + "AppendEvents", _event(seconds=-100), "events[0].at", o),
        Case("event-at-year-10000", r + "AppendEvents", _event(seconds=MAX_TS + 1),
             "events[0].at", o),
        Case("event-at-nanos", r + "AppendEvents", _event(seconds=1, nanos=-7), "events[0].at", o),
        Case("step-event-at-negative", r + "StepBatch", _step(at=-100), "events[0].at", o),
        Case("step-deadline-year-10000", r + "Step", _step(deadline=MAX_TS + 1), "deadline", o),
        Case("deadline-seconds-nan", r + "StartRun", _limits(deadline_seconds=nan),
             "limits.deadline_seconds", o),
        Case("deadline-seconds-inf", r + "StartRun", _limits(deadline_seconds=inf),
             "limits.deadline_seconds", o),
        Case("deadline-seconds-negative", r + "StartRun", _limits(deadline_seconds=-1.0),
             "limits.deadline_seconds", o),
        Case("max-cost-nan", r + "StartRun", _limits(max_cost=nan), "limits.max_cost", o),
        Case("max-cost-negative", r + "StartRun", _limits(max_cost=-0.5), "limits.max_cost", o),
        Case("max-steps-negative", r + "StartRun", _limits(max_steps=-1), "limits.max_steps", o),
    ]  # fmt: skip


def _tokens() -> list[Case]:
    lc, t = EXECUTOR + "ListCalls", "bad_page_token"
    forged = base64.urlsafe_b64encode(b"\x00" * 8 + b"\x01" * 16).decode().rstrip("=")
    return [
        Case("token-digits", lc, pb.ListCallsRequest(page_token="12"), "page_token", t),
        Case("token-garbage", lc, pb.ListCallsRequest(page_token="not a token"), "page_token", t),
        Case("token-forged-mac", lc, pb.ListCallsRequest(page_token=forged), "page_token", t),
        Case("token-huge", lc, pb.ListCallsRequest(page_token="A" * 5000), "page_token", t),
        Case("token-negative", lc, pb.ListCallsRequest(page_token="-5"), "page_token", t),
    ]


def _enums() -> list[Case]:
    lc, e = EXECUTOR + "ListCalls", "unknown_enum"
    return [
        Case("status-99", lc, pb.ListCallsRequest(statuses=[99]), "statuses[0]", e),  # type: ignore[list-item]
        Case("status-negative", lc, pb.ListCallsRequest(statuses=[1, -4]), "statuses[1]", e),  # type: ignore[list-item]
        Case("status-unspecified", lc, pb.ListCallsRequest(statuses=[0]), "statuses[0]", e),  # type: ignore[list-item]
        Case("run-state-bogus", RUNS + "ListRuns", rpb.ListRunsRequest(states=["bogus"]),
             "states[0]", e),
        Case("run-state-case", RUNS + "ListRuns",
             rpb.ListRunsRequest(states=["active", "COMPLETED"]), "states[1]", e),
    ]  # fmt: skip


def _json() -> list[Case]:
    deep = "[" * 65 + "]" * 65
    return [
        Case("data-json-deep", RUNS + "AppendEvents",
             rpb.AppendEventsRequest(run_id="r", events=[
                 rpb.RunEvent(seq=1, from_state="created", to_state="requesting_model",
                              data_json='{"a": ' + deep + "}")]),
             "events[0].data_json", "too_deep"),
        Case("step-data-json-deep", RUNS + "StepBatch",
             _step(data_json='{"a": ' + deep + "}"), "events[0].data_json", "too_deep"),
    ]  # fmt: skip


def _envelope() -> list[Case]:
    x = EXECUTOR
    many = pb.ExecuteRequest(calls=[pb.ToolCall(tool="noop")] * 1001)
    return [
        Case("batch-1001-calls", x + "ExecuteBatch", many, "calls", "too_large"),
        Case("batch-id-257", x + "Execute",
             pb.ExecuteRequest(batch_id="b" * 257, calls=[pb.ToolCall(tool="noop")]),
             "batch_id", "too_large"),
        Case("cancel-nothing", x + "Cancel", pb.CancelRequest(reason="r"), "call_id", "missing"),
        Case("list-calls-limit", x + "ListCalls", pb.ListCallsRequest(limit=-1), "limit",
             "out_of_range"),
        Case("list-runs-limit", RUNS + "ListRuns", rpb.ListRunsRequest(limit=-5), "limit",
             "out_of_range"),
        Case("step-without-key", RUNS + "StepBatch", _step(idempotency_key=""),
             "calls[0].idempotency_key", "missing"),
    ]  # fmt: skip


CASES = _undecodable() + _utf8() + _times() + _tokens() + _enums() + _json() + _envelope()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    yield from module_daemon(tmp_path_factory, "malformed")


def test_the_corpus_has_its_size() -> None:
    # 42 undecodable: 2 per method that takes bytes (ExplainPolicy added 2 to the first 34,
    # ListProviders 2 more, Step and StepBatch 4).
    assert len(CASES) == 42 + 13 + 24 + 5 + 5 + 2 + 6, len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_malformed_request_is_a_typed_refusal(raw: RawClient, daemon: Daemon, case: Case) -> None:
    before = len(daemon.log().splitlines())
    reply = raw.call(case.method, case.request)
    assert reply.code is grpc.StatusCode.INVALID_ARGUMENT, (case, reply)
    assert reply.error_class == case.error_class, (case, reply)
    assert reply.field == case.field, (case, reply)
    short = case.method.rpartition("/")[2]
    if case.field:
        assert case.field in reply.details, reply
    else:
        assert short in reply.details, reply
    assert daemon.serving()
    logged = daemon.log().splitlines()[before:]
    assert "Traceback" not in "\n".join(logged), logged
    assert len([line for line in logged if short in line]) == 1, logged


@pytest.mark.parametrize("depth", [65, 200, 5000])
def test_arguments_nested_beyond_the_bound_are_rejected(daemon: Daemon, depth: int) -> None:
    with Client(daemon.address) as eg:
        text = '{"echo": "x", "deep": ' + "[" * depth + "]" * depth + "}"
        outcome = eg.run(Call(tool="noop", arguments=text))
    assert (outcome.status, outcome.error_class, outcome.field) == (
        Status.REJECTED,
        "invalid_argument",
        "arguments_json",
    ), outcome
    assert "64" in outcome.message


def test_arguments_nested_within_the_bound_pass_the_parser(daemon: Daemon) -> None:
    with Client(daemon.address) as eg:
        ok = eg.run(Call(tool="noop", arguments='{"echo": "' + "[" * 60 + '"}'))
        nested = eg.run(Call(tool="noop", arguments='{"echo": ' + "[" * 62 + "]" * 62 + "}"))
    assert ok.status is Status.SUCCESS, ok
    # Within the bound: the schema (echo is a string) refuses it, not the depth limit.
    assert (nested.status, nested.field) == (Status.REJECTED, "arguments.echo"), nested


@pytest.mark.parametrize(
    "pattern",
    [
        "((a{1000}){1000}){1000}",  # compiling it alone would pin a thread for minutes
        "(?:x{500}){500}",
        "a{300000}",
        "(" * 200 + "a" + ")" * 200,
    ],
)
def test_search_patterns_beyond_the_bound_are_rejected(daemon: Daemon, pattern: str) -> None:
    with Client(daemon.address) as eg:
        outcome = eg.run(Call(tool="search", arguments={"pattern": pattern}))
    assert (outcome.status, outcome.error_class, outcome.field) == (
        Status.REJECTED,
        "invalid_argument",
        "arguments.pattern",
    ), outcome
    assert daemon.serving()


def test_an_invalid_search_pattern_is_rejected_before_it_starts(daemon: Daemon) -> None:
    with Client(daemon.address) as eg:
        outcome = eg.run(Call(tool="search", arguments={"pattern": "(unclosed"}))
    assert (outcome.status, outcome.field) == (Status.REJECTED, "arguments.pattern"), outcome


def test_page_tokens_the_daemon_issued_still_page(daemon: Daemon) -> None:
    with Client(daemon.address) as eg:
        eg.execute([Call(tool="noop", arguments={"echo": str(i)}) for i in range(5)])
        stub_calls = eg.list_calls(tool="noop", limit=1000)
    raw = RawClient(daemon.address)
    try:
        from execgate.v1 import executor_pb2_grpc as pb_grpc

        stub = pb_grpc.ExecutorStub(raw.channel)
        seen: list[str] = []
        token = ""
        while True:
            page = stub.ListCalls(pb.ListCallsRequest(tool="noop", limit=2, page_token=token))
            seen.extend(c.call_id for c in page.calls)
            token = page.next_page_token
            if not token:
                break
            assert not token.isdigit(), token  # opaque, not the journal's seq
        assert seen == [r.call_id for r in stub_calls]
        # A token is bound to its query: another filter refuses it.
        first = stub.ListCalls(pb.ListCallsRequest(tool="noop", limit=2))
        with pytest.raises(grpc.RpcError) as err:
            stub.ListCalls(pb.ListCallsRequest(tool="read_file", page_token=first.next_page_token))
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        raw.close()


def test_no_traceback_after_the_corpus(daemon: Daemon) -> None:
    assert daemon.serving()
    assert "Traceback" not in daemon.log(), daemon.log()[-5000:]
