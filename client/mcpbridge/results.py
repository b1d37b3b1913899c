"""An execgate Outcome as an MCP tool result.

SUCCESS: the tool's text as content, and `structuredContent` with the status, the call's
ids, the tool's structured result (`result`) and the evidence (exit code, bytes, hashes,
path, sandbox). Anything else: `isError: true`, the first content block saying the
status, error class, message and offending field (a policy deny's message names the
rule), what the tool returned after it, and the same `structuredContent`. An
UNKNOWN_OUTCOME says to reconcile before retrying: the call may have changed something
before it was stopped, and nobody saw how far it got.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import mcp_types as types

from ..types import Evidence, Outcome, Status
from .keys import IDEMPOTENCY_META

__all__ = ["call_result", "envelope", "summary"]

RECONCILE = (
    "The call may have changed something before it stopped, and nobody saw how far it got: "
    "reconcile before retrying. Look at the state it touches (or ask an operator: "
    "`execgate calls show {call} --run {run}`), and never repeat it blindly; a retry with "
    f'the same _meta["{IDEMPOTENCY_META}"] returns this outcome again instead of running.'
)


def call_result(outcome: Outcome, run_id: str) -> types.CallToolResult:
    structured = envelope(outcome, run_id)
    if outcome.status is Status.SUCCESS:
        text = outcome.text or (json.dumps(outcome.structured) if outcome.structured else "")
        return types.CallToolResult(
            content=[types.TextContent(text=text)], structured_content=structured
        )
    content: list[types.ContentBlock] = [types.TextContent(text=summary(outcome, run_id))]
    if outcome.text:
        content.append(types.TextContent(text=outcome.text))
    return types.CallToolResult(content=content, structured_content=structured, is_error=True)


def summary(outcome: Outcome, run_id: str) -> str:
    """What a model reads first when a call did not succeed."""
    lines = [f"execgate: {outcome.status.name} ({outcome.error_class})" + _colon(outcome.message)]
    if outcome.field:
        lines.append(f"field: {outcome.field}")
    if outcome.truncated:
        lines.append(
            f"result cut at {outcome.returned_bytes} of {outcome.total_bytes} bytes "
            "(the whole is in the journal)"
        )
    if outcome.replay_of:
        lines.append(f"the recorded outcome of call {outcome.replay_of} (same idempotency key)")
    lines.append(f"call {outcome.call_id} in run {run_id}")
    if outcome.status is Status.UNKNOWN_OUTCOME:
        lines.append(RECONCILE.format(call=outcome.replay_of or outcome.call_id, run=run_id))
    return "\n".join(lines)


def envelope(outcome: Outcome, run_id: str) -> dict[str, Any]:
    """The outcome's fields a client may act on; empty ones left out."""
    found: dict[str, Any] = {
        "status": outcome.status.name,
        "error_class": outcome.error_class,
        "message": outcome.message,
        "field": outcome.field,
        "call_id": outcome.call_id,
        "run_id": run_id,
        "replay_of": outcome.replay_of,
        "result": outcome.structured,
        "truncated": outcome.truncated,
        "returned_bytes": outcome.returned_bytes if outcome.truncated else 0,
        "total_bytes": outcome.total_bytes if outcome.truncated else 0,
        "stopped_how": outcome.stopped_how.value,
        "evidence": _evidence(outcome.evidence),
    }
    return {k: v for k, v in found.items() if v not in ("", 0, False, {}, None, "unspecified")}


def _evidence(evidence: Evidence) -> dict[str, Any]:
    return {
        f.name: value
        for f in dataclasses.fields(evidence)
        if (value := getattr(evidence, f.name)) is not None and value != ""
    }


def _colon(message: str) -> str:
    return f": {message}" if message else ""
