"""Outcomes to and from the JSON the journal stores."""

from __future__ import annotations

import json
from typing import Any

from execgate.executor.core.outcomes import (
    ErrorClass,
    Evidence,
    Mark,
    Outcome,
    Phase,
    Status,
    StopMode,
    ToolResult,
)

from .records import CallRecord, PolicyRecord


def outcome_to_json(outcome: Outcome) -> str:
    # Spelled out rather than dataclasses.asdict: this runs for every call.
    r, e = outcome.result, outcome.evidence
    data = {
        "status": outcome.status.value,
        "error_class": outcome.error_class.value,
        "message": outcome.message,
        "field": outcome.field,
        "result": {
            "text": r.text,
            "structured_json": r.structured_json,
            "truncated": r.truncated,
            "returned_bytes": r.returned_bytes,
            "total_bytes": r.total_bytes,
        },
        "evidence": {
            "exit_code": e.exit_code,
            "signal": e.signal,
            "bytes_written": e.bytes_written,
            "bytes_read": e.bytes_read,
            "sha256_before": e.sha256_before,
            "sha256_after": e.sha256_after,
            "path": e.path,
            "sandbox": e.sandbox,
            "oom_killed": e.oom_killed,
            "survivors": e.survivors,
        },
        "timeline": [[m.phase.value, m.at, m.detail] for m in outcome.timeline],
        "stopped_how": outcome.stopped_how.value,
    }
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def outcome_from_json(text: str) -> Outcome:
    data: dict[str, Any] = json.loads(text)
    return Outcome(
        status=Status(data["status"]),
        error_class=ErrorClass(data["error_class"]),
        message=data["message"],
        field=data["field"],
        result=ToolResult(**data["result"]),
        evidence=Evidence(**data["evidence"]),
        timeline=tuple(Mark(Phase(p), at, detail) for p, at, detail in data["timeline"]),
        stopped_how=StopMode(data["stopped_how"]),
    )


def call_record(row: tuple[Any, ...]) -> CallRecord:
    """A `calls` row (the columns both stores select, in that order) as a CallRecord."""
    (
        run_id,
        call_id,
        batch_id,
        tool,
        args,
        req_hash,
        key,
        agent,
        may_write,
        _state,
        created_at,
        outcome_json,
        replay_of,
        decision_json,
        workspace,
        *raw,
    ) = row
    return CallRecord(
        run_id=run_id,
        call_id=call_id,
        batch_id=batch_id,
        tool=tool,
        arguments_json=args,
        request_hash=req_hash,
        idempotency_key=key or "",
        agent=agent,
        may_write=bool(may_write),
        created_at=created_at,
        outcome=outcome_from_json(outcome_json) if outcome_json else None,
        replay_of=replay_of or "",
        raw_result=(raw[0] or "") if raw else "",
        decision=PolicyRecord.from_json(decision_json) if decision_json else None,
        workspace=workspace,
    )
