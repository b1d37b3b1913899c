"""Protobuf at the edge: `execgate.v1` messages to and from the daemon's dataclasses.

Every message the servicers (services.py, runs_service.py) take apart or send back is
read or built here; inside the daemon only the dataclasses travel.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from google.protobuf.timestamp_pb2 import Timestamp

from execgate.executor.core.errors import MalformedRequest
from execgate.executor.core.outcomes import ErrorClass, Outcome, Phase, Status, StopMode
from execgate.executor.core.requests import MAX_ID_CHARS, CallRequest
from execgate.executor.journal.store import CallFilter, CallRecord
from execgate.executor.locks import LockMode
from execgate.executor.pipeline.approve import Approval, ApprovalState
from execgate.executor.pipeline.events import Event, EventKind, PlanRow
from execgate.executor.pipeline.inflight import CancelOrder
from execgate.executor.policy import PolicyInput
from execgate.executor.policy.explain import Explanation, canonical
from execgate.executor.tools import Mode, ToolSpec
from execgate.executor.tools.mcp.server import ServerStatus
from execgate.v1 import executor_pb2 as pb
from execgate.v1 import runs_pb2 as rpb

from . import wirecheck

# The most calls one Execute (or ExecuteBatch, Explain) request may carry.
MAX_BATCH = 1000
# Longest cancel `reason` and `requester` taken (characters). They are kept in memory
# while the run is barred (inflight.RunBar), in every stopped call's timeline and in
# the journal, so a Cancel carrying megabytes of them is refused, naming the field.
MAX_REASON_CHARS = 1024

# protoc's .pyi types an enum field as the enum class but its `Value()` as a plain int.
_STATUS = {
    s: cast(pb.OutcomeStatus, pb.OutcomeStatus.Value(f"OUTCOME_STATUS_{s.name}")) for s in Status
}
_ERROR = {c: cast(pb.ErrorClass, pb.ErrorClass.Value(f"ERROR_CLASS_{c.name}")) for c in ErrorClass}
_PHASE = {p: cast(pb.Phase, pb.Phase.Value(f"PHASE_{p.name}")) for p in Phase}
_STOP = {m: cast(pb.StopMode, pb.StopMode.Value(f"STOP_MODE_{m.name}")) for m in StopMode}
_LOCK = {m: cast(pb.LockMode, pb.LockMode.Value(f"LOCK_MODE_{m.name}")) for m in LockMode}
_STATUS_BACK = {v: k for k, v in _STATUS.items()}
_APPROVAL = {
    a: cast(pb.ApprovalState, pb.ApprovalState.Value(f"APPROVAL_STATE_{a.name}"))
    for a in ApprovalState
}
_MODE = {Mode.READ: pb.ACCESS_MODE_READ, Mode.WRITE: pb.ACCESS_MODE_WRITE}


def timestamp(seconds: float) -> Timestamp:
    whole = int(seconds)
    return Timestamp(seconds=whole, nanos=int((seconds - whole) * 1e9))


def seconds(ts: Timestamp) -> float:
    return ts.ToNanoseconds() / 1e9


def tool_spec(spec: ToolSpec, provider: str = "builtin", trusted: bool = True) -> pb.ToolSpec:
    return pb.ToolSpec(
        name=spec.name,
        provider=provider,
        annotations_trusted=trusted,
        description=spec.description,
        input_schema_json=json.dumps(spec.input_schema, sort_keys=True),
        effects=pb.ToolEffects(
            read_only=spec.read_only, destructive=spec.destructive, idempotent=spec.idempotent
        ),
        resources=[
            pb.ResourceTemplate(kind=r.kind.value, argument=r.argument, mode=_MODE[r.mode])
            for r in spec.resources
        ],
    )


def call_request(
    msg: pb.ToolCall,
    *,
    run_id: str,
    batch_id: str,
    index: int,
    call_id: str,
    workspace: str = "",
) -> CallRequest:
    timeout = (
        wirecheck.duration(msg.timeout, f"calls[{index}].timeout")
        if msg.HasField("timeout")
        else None
    )
    return CallRequest(
        run_id=run_id,
        call_id=call_id,
        batch_id=batch_id,
        index=index,
        tool=msg.tool,
        arguments_json=msg.arguments_json,
        idempotency_key=msg.idempotency_key,
        timeout=timeout,
        workspace=workspace,
    )


def outcome(o: Outcome) -> pb.Outcome:
    ev = o.evidence
    return pb.Outcome(
        status=_STATUS[o.status],
        error_class=_ERROR[o.error_class],
        message=o.message,
        field=o.field,
        result=pb.ToolResult(
            text=o.result.text,
            structured_json=o.result.structured_json,
            truncated=o.result.truncated,
            returned_bytes=o.result.returned_bytes,
            total_bytes=o.result.total_bytes,
        ),
        evidence=pb.Evidence(
            exit_code=ev.exit_code,
            signal=ev.signal,
            bytes_written=ev.bytes_written,
            bytes_read=ev.bytes_read,
            sha256_before=ev.sha256_before,
            sha256_after=ev.sha256_after,
            path=ev.path,
            sandbox=ev.sandbox,
            oom_killed=ev.oom_killed,
            survivors=ev.survivors,
        ),
        timeline=[
            pb.TimelineMark(phase=_PHASE[m.phase], at=timestamp(m.at), detail=m.detail)
            for m in o.timeline
        ],
        stopped_how=_STOP[o.stopped_how],
    )


def event(e: Event) -> pb.ExecuteEvent:
    msg = pb.ExecuteEvent(
        call_id=e.call_id, batch_id=e.batch_id, time=timestamp(e.at), index=e.index
    )
    match e.kind:
        case EventKind.QUEUED:
            msg.queued.SetInParent()
        case EventKind.WAITING:
            assert e.waiting is not None
            keys, blockers = e.waiting
            msg.waiting.keys.extend(keys)
            msg.waiting.blocked_by.extend(blockers)
        case EventKind.AWAITING_APPROVAL:
            assert e.approval is not None
            a = e.approval
            msg.awaiting_approval.approval_id = a.id
            msg.awaiting_approval.rule_id = a.rule_id
            msg.awaiting_approval.reason = a.reason
            msg.awaiting_approval.expires_at.CopyFrom(timestamp(a.expires_at))
        case EventKind.STARTED:
            msg.started.SetInParent()
        case EventKind.PROGRESS:
            assert e.progress is not None
            done, total, text = e.progress
            msg.progress.progress, msg.progress.total, msg.progress.message = done, total, text
        case EventKind.FINISHED:
            assert e.outcome is not None
            msg.finished.outcome.CopyFrom(outcome(e.outcome))
            msg.finished.replay_of_call_id = e.replay_of
    return msg


def record(r: CallRecord) -> pb.CallRecord:
    msg = pb.CallRecord(
        run_id=r.run_id,
        call_id=r.call_id,
        batch_id=r.batch_id,
        tool=r.tool,
        arguments_json=r.arguments_json,
        idempotency_key=r.idempotency_key,
        agent=r.agent,
        state=pb.CALL_STATE_RUNNING if r.outcome is None else pb.CALL_STATE_FINISHED,
        may_write=r.may_write,
        created_at=timestamp(r.created_at),
        replay_of_call_id=r.replay_of,
        raw_result=r.raw_result,
        workspace=r.workspace,
    )
    if r.outcome is not None:
        msg.outcome.CopyFrom(outcome(r.outcome))
    if r.decision is not None:
        d = r.decision
        msg.policy.CopyFrom(
            pb.PolicyDecision(
                effect=d.effect, rule_ids=d.rule_ids, revision=d.revision, shadow=d.shadow
            )
        )
    return msg


def parked_record(a: Approval, *, may_write: bool) -> pb.CallRecord:
    """A call a policy `ask` rule holds: journaled as an approval, not yet as a call."""
    return pb.CallRecord(
        run_id=a.run_id,
        call_id=a.call_id,
        batch_id=a.batch_id,
        tool=a.tool,
        arguments_json=a.arguments_json,
        idempotency_key=a.idempotency_key,
        agent=a.requester,
        state=pb.CALL_STATE_AWAITING_APPROVAL,
        may_write=may_write,
        created_at=timestamp(a.created_at),
        policy=pb.PolicyDecision(effect="ask", rule_ids=[a.rule_id], approvers=a.approvers),
        approval_id=a.id,
        approval_expires_at=timestamp(a.expires_at),
        approvers=a.approvers,
        workspace=a.workspace,
    )


def call_filter(
    req: pb.ListCallsRequest,
    *,
    run_id: str,
    limit: int,
    before_seq: int,
    agents: tuple[str, ...] | None = None,
) -> CallFilter:
    """The filter of a ListCalls request; an unknown status or a time out of range is a
    MalformedRequest naming the field (never a filter silently dropped)."""
    return CallFilter(
        run_id=run_id,
        statuses=wirecheck.enum_values(req.statuses, _STATUS_BACK, "statuses"),
        tool=req.tool,
        workspace=req.workspace,
        since=wirecheck.timestamp(req.since, "since") if req.HasField("since") else None,
        until=wirecheck.timestamp(req.until, "until") if req.HasField("until") else None,
        finished_since=wirecheck.timestamp(req.finished_since, "finished_since")
        if req.HasField("finished_since")
        else None,
        limit=limit,
        before_seq=before_seq,
        agents=agents,
    )


def call_plan(row: PlanRow) -> pb.CallPlan:
    req = row.request
    msg = pb.CallPlan(call_id=req.call_id, index=req.index, tool=req.tool, waits_for=row.waits_for)
    if row.rejected is not None:
        msg.rejected.CopyFrom(outcome(row.rejected))
    if row.decision is not None:
        d = row.decision
        msg.policy.CopyFrom(
            pb.PolicyDecision(
                effect=d.effect.value,
                rule_ids=d.rule_ids,
                revision=d.revision,
                shadow=[f"{rule}:{effect.value}" for rule, effect in d.shadow],
                approvers=d.ask.approvers if d.ask is not None else (),
            )
        )
    if row.call is not None:
        msg.may_write = row.call.may_write
        msg.claims.extend(
            pb.ResourceClaim(key=c.key.render(), mode=_MODE[c.mode])
            for c in row.call.effects.claims
        )
        msg.locks.extend(
            pb.LockRequest(key=k.render(), mode=_LOCK[m])
            for k, m in sorted(row.call.lock_plan.items())
        )
    return msg


def approval(a: Approval) -> pb.Approval:
    msg = pb.Approval(
        approval_id=a.id,
        run_id=a.run_id,
        call_id=a.call_id,
        batch_id=a.batch_id,
        tool=a.tool,
        arguments_json=a.arguments_json,
        requester=a.requester,
        rule_id=a.rule_id,
        reason=a.reason,
        approvers=a.approvers,
        created_at=timestamp(a.created_at),
        expires_at=timestamp(a.expires_at),
        state=_APPROVAL[a.state],
        decided_by=a.decided_by,
        comment=a.comment,
        workspace=a.workspace,
    )
    if a.decided_at is not None:
        msg.decided_at.CopyFrom(timestamp(a.decided_at))
    return msg


def explanation(e: Explanation) -> pb.ExplainPolicyResponse:
    return pb.ExplainPolicyResponse(
        decision=pb.PolicyDecision(
            effect=e.effect,
            rule_ids=e.rule_ids,
            revision=e.revision,
            shadow=[f"{rid}:{eff}" for rid, eff in e.shadow],
            approvers=e.approvers,
        ),
        reason=e.reason,
        rules=[
            pb.RuleVerdict(
                rule_id=r.rule_id, effect=r.effect, shadow=r.shadow, not_matched_by=r.not_matched_by
            )
            for r in e.rules
        ],
        approval_ttl_seconds=e.ttl or 0.0,
        runs_with_json=json.dumps(e.runs_with),
        source=e.source,
    )


def policy_input(
    req: pb.ExplainPolicyRequest, agent: str, member_of: frozenset[str]
) -> PolicyInput:
    """The described call of an ExplainPolicy, for `agent` with `member_of`; ValueError
    naming the field for arguments that are not a JSON object."""
    try:
        args = json.loads(req.arguments_json) if req.arguments_json else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments_json: not JSON: {exc}") from None
    if not isinstance(args, dict):
        raise ValueError("arguments_json: must be a JSON object")
    argv = args.get("argv")
    return PolicyInput(
        tool=req.tool,
        agent=agent,
        memberships=member_of,
        paths=tuple(canonical(p) for p in req.paths),
        tables=tuple(req.tables),
        hosts=tuple(req.hosts),
        argv=tuple(str(a) for a in argv) if isinstance(argv, list) else None,
        args=args,
    )


# -- Executor: requests in ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRequest:
    """An Execute, ExecuteBatch or Explain request as the dispatcher takes it."""

    run_id: str
    batch_id: str
    calls: list[CallRequest]
    # The caller wants FINISHED events only.
    outcomes_only: bool
    # The run's deadline (wall clock), if the request set one.
    deadline: float | None


def batch_request(
    request: pb.ExecuteRequest | rpb.StepRequest, *, default_run: str, new_id: Callable[[str], str]
) -> BatchRequest:
    """The request's calls, ids assigned (`new_id("batch")`, `new_id("call")`) where the
    client left them out; a malformed envelope is a MalformedRequest naming the field."""
    if len(request.calls) > MAX_BATCH:
        raise MalformedRequest(
            "too_large",
            "calls",
            f"calls: {len(request.calls)} calls; a batch holds at most {MAX_BATCH}",
        )
    if len(request.batch_id) > MAX_ID_CHARS:
        raise MalformedRequest(
            "too_large", "batch_id", f"batch_id: longer than {MAX_ID_CHARS} characters"
        )
    # A loop step works in its run's workspace (pipeline/workspaces): it names none.
    workspace = request.workspace if isinstance(request, pb.ExecuteRequest) else ""
    if len(workspace) > MAX_ID_CHARS:
        raise MalformedRequest(
            "too_large", "workspace", f"workspace: longer than {MAX_ID_CHARS} characters"
        )
    run_id = request.run_id or default_run
    batch_id = request.batch_id or new_id("batch")
    calls = [
        call_request(
            c,
            run_id=run_id,
            batch_id=batch_id,
            index=i,
            call_id=c.call_id or new_id("call"),
            workspace=workspace,
        )
        for i, c in enumerate(request.calls)
    ]
    return BatchRequest(
        run_id=run_id,
        batch_id=batch_id,
        calls=calls,
        outcomes_only=request.outcomes_only,
        deadline=_deadline(request),
    )


def _deadline(request: pb.ExecuteRequest | rpb.StepRequest) -> float | None:
    if not request.HasField("deadline"):
        return None
    return wirecheck.timestamp(request.deadline, "deadline")


def cancel_order(
    request: pb.CancelRequest, *, at: float, default_run: str, caller: str, only_agent: str
) -> CancelOrder:
    """The order a Cancel request gives, made at `at` by `caller` (what the body claims
    as requester is kept as a claim); a malformed request is a MalformedRequest."""
    if not (request.run_id or request.call_id or request.batch_id):
        raise MalformedRequest(
            "missing", "call_id", "name a run_id, a call_id or a batch_id to cancel"
        )
    for name in ("reason", "requester"):
        if len(getattr(request, name)) > MAX_REASON_CHARS:
            raise MalformedRequest(
                "too_large", name, f"{name}: longer than {MAX_REASON_CHARS} characters"
            )
    grace = wirecheck.duration(request.grace, "grace") if request.HasField("grace") else None
    claimed = request.requester
    # A call id is unique within its run (default: the implicit run); a batch or a
    # run is a target by itself, so a batch in any run is reached without its run.
    return CancelOrder(
        run_id=request.run_id or (default_run if request.call_id else ""),
        call_id=request.call_id,
        batch_id=request.batch_id,
        reason=request.reason or "cancelled by client",
        grace=grace,
        requester=f"{caller} (says: {claimed})" if claimed and claimed != caller else caller,
        at=at,
        only_agent=only_agent,
    )


def page_query(request: pb.ListCallsRequest, who: str) -> bytes:
    """What a page token is bound to: the filter (not the page size) and the caller."""
    shape = pb.ListCallsRequest()
    shape.CopyFrom(request)
    shape.ClearField("page_token")
    shape.ClearField("limit")
    return who.encode() + b"\0" + shape.SerializeToString(deterministic=True)


# -- Executor: responses out --------------------------------------------------------------


def tools(specs: Iterable[tuple[ToolSpec, str, bool]]) -> pb.ListToolsResponse:
    """Each tool's spec with its provider ("builtin", "command", "mcp:SERVER") and
    whether its effects are believed."""
    return pb.ListToolsResponse(tools=[tool_spec(s, p, t) for s, p, t in specs])


def providers(statuses: Iterable[ServerStatus]) -> pb.ListProvidersResponse:
    """Each MCP server's state, as `McpProvider.status` reports it."""
    return pb.ListProvidersResponse(
        providers=[
            pb.ProviderStatus(
                provider=f"mcp:{s.name}",
                running=s.running,
                restarts=s.restarts,
                last_error=s.last_error,
                tools=s.tools,
            )
            for s in statuses
        ]
    )


def batch_response(batch_id: str, finished: Sequence[Event | None]) -> pb.ExecuteResponse:
    """ExecuteBatch's answer: each call's FINISHED event, in proposal order."""
    return pb.ExecuteResponse(
        batch_id=batch_id,
        outcomes=[pb.ExecuteEvent() if e is None else event(e) for e in finished],
    )


def plan(rows: Iterable[PlanRow]) -> pb.ExplainResponse:
    return pb.ExplainResponse(calls=[call_plan(r) for r in rows])


def cancelled(call_ids: list[str]) -> pb.CancelResponse:
    return pb.CancelResponse(call_ids=call_ids)


def calls_page(records: Iterable[CallRecord], next_page_token: str) -> pb.ListCallsResponse:
    return pb.ListCallsResponse(calls=[record(r) for r in records], next_page_token=next_page_token)


def approvals(found: Iterable[Approval]) -> pb.ListPendingResponse:
    return pb.ListPendingResponse(approvals=[approval(a) for a in found])
