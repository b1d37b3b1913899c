"""Protobuf at the client's edge: `execgate.v1` to the client's dataclasses and back."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, cast

import grpc
from google.protobuf.duration_pb2 import Duration

from execgate.v1 import executor_pb2 as pb
from execgate.v1 import runs_pb2 as rpb

from .errors import (
    ApprovalNotPending,
    CallNotFound,
    DaemonUnavailable,
    ExecgateClientError,
    PermissionDenied,
    RequestError,
    RunNotFound,
    RunRefused,
    Unauthenticated,
)
from .types import (
    Approval,
    ApprovalState,
    Call,
    CallPlan,
    CallRecord,
    Event,
    EventKind,
    Evidence,
    Mark,
    Outcome,
    PolicyDecision,
    PolicyExplanation,
    ProviderStatus,
    RuleVerdict,
    Status,
    StopMode,
    ToolSpec,
)

DEFAULT_ADDRESS = "unix:var/execgate.sock"
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def resolve_address(address: str | None) -> str:
    """--addr, then $EXECGATE_ADDR, then the socket `make run` creates."""
    chosen = address or os.environ.get("EXECGATE_ADDR") or DEFAULT_ADDRESS
    if chosen.startswith("unix:") and not chosen.startswith("unix:/"):
        chosen = "unix:" + os.path.abspath(chosen.removeprefix("unix:"))
    return chosen


def _enum_name(enum_type: Any, value: int, prefix: str) -> str:
    return str(enum_type.Name(value)).removeprefix(prefix).lower()


def outcome(msg: pb.Outcome, call_id: str, replay_of: str = "") -> Outcome:
    ev = msg.evidence

    def opt(name: str) -> Any:
        return getattr(ev, name) if ev.HasField(name) else None

    return Outcome(
        call_id=call_id,
        status=Status(_enum_name(pb.OutcomeStatus, msg.status, "OUTCOME_STATUS_")),
        error_class=_enum_name(pb.ErrorClass, msg.error_class, "ERROR_CLASS_"),
        message=msg.message,
        field=msg.field,
        text=msg.result.text,
        structured=json.loads(msg.result.structured_json) if msg.result.structured_json else {},
        truncated=msg.result.truncated,
        returned_bytes=msg.result.returned_bytes,
        total_bytes=msg.result.total_bytes,
        evidence=Evidence(
            exit_code=opt("exit_code"),
            signal=opt("signal"),
            bytes_written=opt("bytes_written"),
            bytes_read=opt("bytes_read"),
            sha256_before=opt("sha256_before"),
            sha256_after=opt("sha256_after"),
            path=ev.path,
            sandbox=ev.sandbox,
            oom_killed=opt("oom_killed"),
            survivors=opt("survivors"),
        ),
        timeline=tuple(
            Mark(_enum_name(pb.Phase, m.phase, "PHASE_"), m.at.ToNanoseconds() / 1e9, m.detail)
            for m in msg.timeline
        ),
        stopped_how=StopMode(_enum_name(pb.StopMode, msg.stopped_how, "STOP_MODE_")),
        replay_of=replay_of,
    )


def event(msg: pb.ExecuteEvent) -> Event:
    kind = EventKind(msg.WhichOneof("kind"))
    result = None
    if kind is EventKind.FINISHED:
        result = outcome(msg.finished.outcome, msg.call_id, msg.finished.replay_of_call_id)
    asked = msg.awaiting_approval
    return Event(
        kind=kind,
        call_id=msg.call_id,
        batch_id=msg.batch_id,
        index=msg.index,
        at=msg.time.ToNanoseconds() / 1e9,
        outcome=result,
        keys=tuple(msg.waiting.keys),
        blocked_by=tuple(msg.waiting.blocked_by),
        approval_id=asked.approval_id,
        rule_id=asked.rule_id,
        reason=asked.reason,
        expires_at=_seconds(asked.expires_at) if asked.HasField("expires_at") else None,
        progress=msg.progress.progress,
        total=msg.progress.total,
        progress_message=msg.progress.message,
    )


def _seconds(ts: Any) -> float:
    return float(ts.ToNanoseconds()) / 1e9


def approval(msg: pb.Approval) -> Approval:
    return Approval(
        approval_id=msg.approval_id,
        run_id=msg.run_id,
        call_id=msg.call_id,
        batch_id=msg.batch_id,
        tool=msg.tool,
        arguments_json=msg.arguments_json,
        requester=msg.requester,
        rule_id=msg.rule_id,
        reason=msg.reason,
        approvers=tuple(msg.approvers),
        created_at=_seconds(msg.created_at),
        expires_at=_seconds(msg.expires_at),
        state=ApprovalState(_enum_name(pb.ApprovalState, msg.state, "APPROVAL_STATE_")),
        decided_by=msg.decided_by,
        comment=msg.comment,
        decided_at=_seconds(msg.decided_at) if msg.HasField("decided_at") else None,
        workspace=msg.workspace,
    )


def call_plans(response: pb.ExplainResponse) -> list[CallPlan]:
    return [
        CallPlan(
            call_id=p.call_id,
            index=p.index,
            tool=p.tool,
            may_write=p.may_write,
            claims=tuple(
                (c.key, _enum_name(pb.AccessMode, c.mode, "ACCESS_MODE_")) for c in p.claims
            ),
            locks=tuple(
                (r.key, pb.LockMode.Name(r.mode).removeprefix("LOCK_MODE_")) for r in p.locks
            ),
            waits_for=tuple(p.waits_for),
            rejected=outcome(p.rejected, p.call_id) if p.HasField("rejected") else None,
            policy=_policy(p.policy) if p.HasField("policy") else None,
        )
        for p in response.calls
    ]


def outcomes(response: pb.ExecuteResponse | rpb.StepResponse) -> list[Outcome]:
    """The outcomes of an ExecuteBatch (or a StepBatch), in proposal order."""
    return [
        outcome(e.finished.outcome, e.call_id, e.finished.replay_of_call_id)
        for e in response.outcomes
    ]


def execute_request(
    calls: Iterable[Call],
    run_id: str,
    batch_id: str,
    outcomes_only: bool,
    deadline: float | None = None,
    workspace: str = "",
) -> pb.ExecuteRequest:
    request = pb.ExecuteRequest(
        run_id=run_id,
        batch_id=batch_id,
        outcomes_only=outcomes_only,
        calls=[tool_call(c) for c in calls],
        workspace=workspace,
    )
    if deadline is not None:
        request.deadline.FromNanoseconds(int(deadline * 1e9))
    return request


def cancel_request(
    *,
    run_id: str,
    call_id: str,
    batch_id: str,
    reason: str,
    grace: float | None,
    requester: str,
) -> pb.CancelRequest:
    request = pb.CancelRequest(
        run_id=run_id, call_id=call_id, batch_id=batch_id, reason=reason, requester=requester
    )
    if grace is not None:
        request.grace.CopyFrom(duration(grace))
    return request


def tool_call(call: Call) -> pb.ToolCall:
    msg = pb.ToolCall(
        call_id=call.call_id,
        tool=call.tool,
        arguments_json=call.arguments_json(),
        idempotency_key=call.idempotency_key,
    )
    if call.timeout is not None:
        msg.timeout.CopyFrom(duration(call.timeout))
    return msg


def duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def tool_spec(msg: pb.ToolSpec) -> ToolSpec:
    return ToolSpec(
        name=msg.name,
        description=msg.description,
        input_schema=json.loads(msg.input_schema_json or "{}"),
        read_only=msg.effects.read_only,
        destructive=msg.effects.destructive,
        idempotent=msg.effects.idempotent,
        provider=msg.provider or "builtin",
        annotations_trusted=msg.annotations_trusted,
    )


def provider_status(msg: pb.ProviderStatus) -> ProviderStatus:
    return ProviderStatus(
        provider=msg.provider,
        running=msg.running,
        restarts=msg.restarts,
        last_error=msg.last_error,
        tools=msg.tools,
    )


def record(msg: pb.CallRecord) -> CallRecord:
    finished = msg.state == pb.CALL_STATE_FINISHED
    return CallRecord(
        run_id=msg.run_id,
        call_id=msg.call_id,
        batch_id=msg.batch_id,
        tool=msg.tool,
        arguments_json=msg.arguments_json,
        idempotency_key=msg.idempotency_key,
        agent=msg.agent,
        may_write=msg.may_write,
        created_at=msg.created_at.ToNanoseconds() / 1e9,
        running=not finished,
        outcome=outcome(msg.outcome, msg.call_id, msg.replay_of_call_id) if finished else None,
        replay_of=msg.replay_of_call_id,
        raw_result=msg.raw_result,
        policy=_policy(msg.policy) if msg.HasField("policy") else None,
        awaiting_approval=msg.approval_id,
        approval_expires_at=(
            msg.approval_expires_at.ToNanoseconds() / 1e9
            if msg.HasField("approval_expires_at")
            else None
        ),
        approvers=tuple(msg.approvers),
        workspace=msg.workspace,
    )


def _policy(msg: pb.PolicyDecision) -> PolicyDecision:
    return PolicyDecision(
        msg.effect, tuple(msg.rule_ids), msg.revision, tuple(msg.shadow), tuple(msg.approvers)
    )


def explain_policy_request(
    tool: str,
    *,
    agent: str,
    groups: Iterable[str],
    roles: Iterable[str],
    paths: Iterable[str],
    tables: Iterable[str],
    hosts: Iterable[str],
    arguments: Mapping[str, Any] | None,
) -> pb.ExplainPolicyRequest:
    return pb.ExplainPolicyRequest(
        tool=tool,
        agent=agent,
        groups=_names("groups", groups),
        roles=_names("roles", roles),
        paths=_names("paths", paths),
        tables=_names("tables", tables),
        hosts=_names("hosts", hosts),
        arguments_json="" if arguments is None else json.dumps(dict(arguments), ensure_ascii=False),
    )


def _names(name: str, values: Iterable[str]) -> list[str]:
    # A bare string is an iterable of one-letter names: almost surely a mistake.
    if isinstance(values, str):
        raise TypeError(f"{name}: a list of strings, not a string")
    return list(values)


def policy_explanation(msg: pb.ExplainPolicyResponse) -> PolicyExplanation:
    return PolicyExplanation(
        decision=_policy(msg.decision),
        reason=msg.reason,
        rules=tuple(
            RuleVerdict(r.rule_id, r.effect, r.shadow, tuple(r.not_matched_by)) for r in msg.rules
        ),
        approval_ttl=msg.approval_ttl_seconds or None,
        runs_with=json.loads(msg.runs_with_json or "{}"),
        source=msg.source,
    )


def list_request(
    *,
    run_id: str,
    statuses: Iterable[Status],
    tool: str,
    limit: int,
    page_token: str,
    since: float | None = None,
    finished_since: float | None = None,
    workspace: str = "",
) -> pb.ListCallsRequest:
    request = pb.ListCallsRequest(
        run_id=run_id,
        tool=tool,
        workspace=workspace,
        limit=limit,
        page_token=page_token,
        # protoc's .pyi types the field as the enum class but `Value()` as a plain int.
        statuses=[
            cast(pb.OutcomeStatus, pb.OutcomeStatus.Value("OUTCOME_STATUS_" + s.name))
            for s in statuses
        ],
    )
    if since is not None:
        request.since.FromNanoseconds(round(since * 1e9))
    if finished_since is not None:
        request.finished_since.FromNanoseconds(round(finished_since * 1e9))
    return request


_RUN_REFUSALS = (
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.INVALID_ARGUMENT,
)


def translate(
    exc: grpc.RpcError,
    address: str,
    *,
    run_id: str = "",
    call_id: str = "",
    approval_id: str = "",
    run_op: bool = False,
) -> ExecgateClientError:
    """One place where gRPC errors become the client's exceptions."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code is grpc.StatusCode.UNAVAILABLE:
        return DaemonUnavailable(address, details or "")
    if run_op and code is grpc.StatusCode.NOT_FOUND:
        return RunNotFound(run_id)
    if run_op and code in _RUN_REFUSALS:
        return RunRefused(run_id, details or "")
    if code is grpc.StatusCode.NOT_FOUND and call_id:
        return CallNotFound(run_id, call_id)
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION) and approval_id:
        return ApprovalNotPending(approval_id, details or "")
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(address, details or "")
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(address, details or "")
    pairs = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    # grpc-stubs type the items as objects with .key/.value; at run time they are pairs.
    items = cast("Iterable[tuple[str, str]]", pairs or ())
    trailers = {str(k): str(v) for k, v in items}
    return RequestError(
        code.name if code else "UNKNOWN",
        details or "",
        error_class=trailers.get("execgate-error-class", ""),
        field=trailers.get("execgate-field", ""),
    )
