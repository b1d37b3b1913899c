"""Typed access to a provider's JSON, shared by the adapters.

Each helper names the field it wanted, so a `ModelBadResponse` says what was wrong.
"""

from __future__ import annotations

import json
from typing import Any

from .base import ToolCall, ToolResult
from .errors import ModelBadResponse


def field_dict(doc: dict[str, Any], key: str, where: str, model: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise ModelBadResponse(model, f"{where}.{key} is not an object: {_kind(value)}")
    return value


def field_list(doc: dict[str, Any], key: str, where: str, model: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise ModelBadResponse(model, f"{where}.{key} is not a list: {_kind(value)}")
    return value


def field_str(doc: dict[str, Any], key: str, where: str, model: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise ModelBadResponse(model, f"{where}.{key} is not a string: {_kind(value)}")
    return value


def optional_dict(doc: dict[str, Any], key: str) -> dict[str, Any]:
    """An object the server may leave out (usage, on some local servers): {} then."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def as_dict(value: Any, where: str, model: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ModelBadResponse(model, f"{where} is not an object: {_kind(value)}")
    return value


def token_count(usage: dict[str, Any], key: str) -> int:
    """A usage counter; 0 when the server leaves it out (some local servers do)."""
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def json_arguments(text: str, call_id: str, model: str) -> dict[str, Any]:
    """Arguments sent as a JSON string; an empty string means no arguments."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ModelBadResponse(
            model, f"tool call {call_id!r}: arguments are not valid JSON ({exc}): {text[:200]!r}"
        ) from None
    if not isinstance(value, dict):
        raise ModelBadResponse(
            model, f"tool call {call_id!r}: arguments are not a JSON object: {_kind(value)}"
        )
    return value


def in_call_order(
    results: tuple[ToolResult, ...], calls: tuple[ToolCall, ...]
) -> tuple[ToolResult, ...]:
    """Results in the order of the calls they answer; unmatched ones last, as given."""
    position = {call.id: i for i, call in enumerate(calls)}
    return tuple(sorted(results, key=lambda r: position.get(r.call_id, len(calls))))


def _kind(value: Any) -> str:
    return "missing" if value is None else type(value).__name__
