"""Fuzzing the request decoder: hostile bytes on every RPC get a typed status.

Random bytes and mutations of a valid request (bytes flipped, cut, inserted, a
field's bytes made invalid UTF-8) are sent raw to each RPC method of a real daemon,
through a channel whose serializers pass bytes unchanged. Every answer must be a
typed status (OK, INVALID_ARGUMENT, NOT_FOUND, ...), never UNKNOWN or INTERNAL;
afterwards the daemon still answers Health and its log holds no traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from hypothesis import given
from hypothesis import strategies as st

from execgate.v1 import executor_pb2 as pb
from execgate.v1 import runs_pb2 as rpb
from tests.daemon import Daemon
from tests.security.budget import fuzzing
from tests.security.rawrpc import METHODS, WATCHES, RawClient, module_daemon

TYPED = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,  # Health/List: grpc's aio health servicer lacks it
    }
)

# One valid request per method, to mutate.
SAMPLES: dict[str, Message] = {
    "/execgate.v1.Executor/ListTools": pb.ListToolsRequest(),
    "/execgate.v1.Executor/ListProviders": pb.ListProvidersRequest(),
    "/execgate.v1.Executor/Execute": pb.ExecuteRequest(
        run_id="fuzz",
        calls=[pb.ToolCall(tool="noop", arguments_json='{"echo": "hi"}', idempotency_key="k")],
        deadline={"seconds": 4_000_000_000},
    ),
    "/execgate.v1.Executor/ExecuteBatch": pb.ExecuteRequest(
        calls=[pb.ToolCall(call_id="c1", tool="noop", timeout={"seconds": 5})]
    ),
    "/execgate.v1.Executor/Explain": pb.ExecuteRequest(
        calls=[pb.ToolCall(tool="read_file", arguments_json='{"path": "a.txt"}')]
    ),
    "/execgate.v1.Executor/ExplainPolicy": pb.ExplainPolicyRequest(
        tool="write_file", paths=["src/a.py"], arguments_json='{"path": "src/a.py"}'
    ),
    "/execgate.v1.Executor/Cancel": pb.CancelRequest(
        call_id="nope", reason="fuzz", grace={"seconds": 1}
    ),
    "/execgate.v1.Executor/GetCall": pb.GetCallRequest(call_id="c1", include_raw=True),
    "/execgate.v1.Executor/ListCalls": pb.ListCallsRequest(
        statuses=[pb.OUTCOME_STATUS_SUCCESS],
        tool="noop",
        since={"seconds": 1},
        until={"seconds": 4_000_000_000},
        limit=5,
        page_token="x",
    ),
    "/execgate.v1.Approvals/ListPending": pb.ListPendingRequest(),
    "/execgate.v1.Approvals/Watch": pb.WatchApprovalsRequest(),
    "/execgate.v1.Approvals/Decide": pb.DecideRequest(approval_id="a1", approve=True),
    "/execgate.v1.Approvals/List": pb.ListApprovalsRequest(run_id="fuzz"),
    "/execgate.v1.Runs/StartRun": rpb.StartRunRequest(
        goal="g", limits=rpb.RunLimits(max_steps=3, deadline_seconds=5.0), labels={"a": "b"}
    ),
    "/execgate.v1.Runs/AppendEvents": rpb.AppendEventsRequest(
        run_id="fuzz-run",
        events=[
            rpb.RunEvent(
                seq=1,
                at={"seconds": 1_700_000_000},
                from_state="created",
                to_state="requesting_model",
                data_json="{}",
            )
        ],
    ),
    "/execgate.v1.Runs/Step": rpb.StepRequest(
        run_id="fuzz-run",
        events=[
            rpb.RunEvent(seq=2, from_state="requesting_model", to_state="validating"),
            rpb.RunEvent(seq=3, from_state="validating", to_state="running_tools"),
        ],
        calls=[pb.ToolCall(call_id="c1", tool="noop", arguments_json="{}", idempotency_key="k")],
        deadline={"seconds": 4_000_000_000},
    ),
    "/execgate.v1.Runs/StepBatch": rpb.StepRequest(
        run_id="fuzz-run",
        events=[rpb.RunEvent(seq=2, from_state="requesting_model", to_state="validating")],
        calls=[pb.ToolCall(call_id="c2", tool="noop", idempotency_key="k2")],
        outcomes_only=True,
    ),
    "/execgate.v1.Runs/GetRun": rpb.GetRunRequest(run_id="fuzz-run"),
    "/execgate.v1.Runs/ListRuns": rpb.ListRunsRequest(states=["active"], limit=3),
    "/execgate.v1.Runs/CancelRun": rpb.CancelRunRequest(run_id="nope", reason="r"),
    "/execgate.v1.Runs/WatchRun": rpb.WatchRunRequest(run_id="nope"),
    "/grpc.health.v1.Health/Check": health_pb2.HealthCheckRequest(service=""),
    "/grpc.health.v1.Health/Watch": health_pb2.HealthCheckRequest(service=""),
    "/grpc.health.v1.Health/List": health_pb2.HealthListRequest(),
}
assert set(SAMPLES) == set(METHODS), set(METHODS) ^ set(SAMPLES)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    yield from module_daemon(tmp_path_factory, "fuzz-requests")


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "utf8", "byte"]))
        at = draw(st.integers(0, len(data)))
        if kind == "flip" and data:
            i = min(at, len(data) - 1)
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            data = data[:at]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "utf8":
            data[at:at] = draw(
                st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xe2\x82"])
            )
        elif data:
            data[min(at, len(data) - 1)] = draw(st.integers(0, 255))
    return bytes(data)


def requests(method: str) -> st.SearchStrategy[bytes]:
    valid = SAMPLES[method].SerializeToString()
    return st.binary(max_size=300) | mutated(valid)


def _check(raw: RawClient, method: str, data: bytes) -> None:
    reply = raw.call(method, data)
    allowed = TYPED | ({grpc.StatusCode.DEADLINE_EXCEEDED} if method in WATCHES else set())
    assert reply.code in allowed, (method, data, reply)
    if reply.code is grpc.StatusCode.INVALID_ARGUMENT:
        assert reply.details, (method, data, reply)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_answers_hostile_bytes_with_a_typed_status(
    raw: RawClient, daemon: Daemon, method: str
) -> None:
    examples = 15 if method in WATCHES else 60

    @fuzzing(examples=examples)
    @given(data=requests(method))
    def fuzz(data: bytes) -> None:
        _check(raw, method, data)

    fuzz()
    assert daemon.serving(), daemon.log()[-3000:]


def test_the_daemon_serves_and_logged_no_traceback_after_the_fuzz(
    raw: RawClient, daemon: Daemon
) -> None:
    # Runs after the fuzzers above (same module daemon): a last undecodable request.
    reply = raw.call("/execgate.v1.Executor/GetCall", b"\xff\xff\xff")
    assert reply.code is grpc.StatusCode.INVALID_ARGUMENT, reply
    assert daemon.serving()
    assert daemon.proc is not None
    assert daemon.proc.poll() is None
    assert "Traceback" not in daemon.log(), daemon.log()[-5000:]


def test_an_undecodable_request_logs_one_line(daemon: Daemon, tmp_path: Path) -> None:
    client = RawClient(daemon.address)
    try:
        before = daemon.log().count("\n")
        reply = client.call("/execgate.v1.Executor/ListCalls", b"\x0a\x05ab")
        assert reply.code is grpc.StatusCode.INVALID_ARGUMENT, reply
        assert "ListCalls" in reply.details, reply
        assert daemon.serving()
        lines = daemon.log().splitlines()[before:]
        mentions = [line for line in lines if "ListCalls" in line]
        assert len(mentions) == 1, lines
    finally:
        client.close()
