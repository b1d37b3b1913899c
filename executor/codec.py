"""Outcomes to and from the JSON the journal stores."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from .outcomes import ErrorClass, Evidence, Mark, Outcome, Phase, Status, StopMode, ToolResult


def outcome_to_json(outcome: Outcome) -> str:
    data = asdict(outcome)
    data["status"] = outcome.status.value
    data["error_class"] = outcome.error_class.value
    data["stopped_how"] = outcome.stopped_how.value
    data["timeline"] = [[m.phase.value, m.at, m.detail] for m in outcome.timeline]
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
