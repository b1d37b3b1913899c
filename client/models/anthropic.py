"""`AnthropicMessagesModel`: Anthropic's Messages API (POST {base_url}/v1/messages).

Wire rules followed:

- `system` is a top-level string; tools are `{"name", "description", "input_schema"}`;
- an assistant turn is a list of content blocks: its text as `{"type": "text"}`, then
  each call as `{"type": "tool_use", "id", "name", "input"}`;
- the results of one turn go in ONE user message, as `{"type": "tool_result",
  "tool_use_id", "content", "is_error"}` blocks in the order of the calls, and they come
  FIRST in that message, before any text;
- roles must alternate, so consecutive messages of one role are merged (a tool_results
  message and a user message both have role "user"); the merged message keeps its
  tool_result blocks first. Messages with nothing to say (no text, no calls, no results)
  are left out: the API refuses empty text blocks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from . import _parse
from ._http import post_json
from .base import Message, ModelTool, Pricing, ToolCall, Turn
from .errors import ModelBadResponse

# Frozen, so safe to share as a default.
_FREE = Pricing()


class AnthropicMessagesModel:
    """A Claude model behind the Messages API."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: str | None = None,
        anthropic_version: str = "2023-06-01",
        max_tokens: int = 4096,
        pricing: Pricing = _FREE,
        timeout: float = 60.0,
    ) -> None:
        """Args:
        model: the provider's model name, sent as "model"; also this object's `name`.
        base_url: the API root, without /v1.
        api_key: sent as x-api-key; None reads ANTHROPIC_API_KEY.
        anthropic_version: sent as the anthropic-version header.
        max_tokens: the most tokens one turn may produce (the API requires it).
        pricing: prices per million tokens, for `Usage.cost`.
        timeout: seconds for the connection and for the answer.
        """
        self.name = model
        self.base_url = base_url.rstrip("/")
        self.anthropic_version = anthropic_version
        self.max_tokens = max_tokens
        self.pricing = pricing
        self.timeout = timeout
        self._api_key = os.environ.get("ANTHROPIC_API_KEY", "") if api_key is None else api_key

    def __repr__(self) -> str:
        return f"AnthropicMessagesModel({self.name!r}, base_url={self.base_url!r})"

    def respond(
        self, messages: Sequence[Message], tools: Sequence[ModelTool], *, system: str = ""
    ) -> Turn:
        body: dict[str, Any] = {
            "model": self.name,
            "max_tokens": self.max_tokens,
            "messages": wire_messages(messages),
        }
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [_wire_tool(t) for t in tools]
        headers = {"x-api-key": self._api_key, "anthropic-version": self.anthropic_version}
        doc = post_json(
            f"{self.base_url}/v1/messages",
            body,
            headers=headers,
            model=self.name,
            timeout=self.timeout,
            secret=self._api_key,
        )
        return _turn(doc, self.name, self.pricing)


def wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation as Messages API messages, roles alternating."""
    wire: list[dict[str, Any]] = []
    calls: tuple[ToolCall, ...] = ()
    for message in messages:
        blocks = _blocks(message, calls)
        if message.role == "assistant":
            calls = message.tool_calls
        if not blocks:
            continue
        role = "assistant" if message.role == "assistant" else "user"
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"] = _results_first(wire[-1]["content"] + blocks)
        else:
            wire.append({"role": role, "content": blocks})
    return wire


def _blocks(message: Message, calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    text = [{"type": "text", "text": message.text}] if message.text else []
    match message.role:
        case "user":
            return text
        case "assistant":
            return text + [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                for c in message.tool_calls
            ]
        case "tool_results":
            results = [
                {
                    "type": "tool_result",
                    "tool_use_id": r.call_id,
                    "content": r.content,
                    "is_error": r.is_error,
                }
                for r in _parse.in_call_order(message.results, calls)
            ]
            return results + text


def _results_first(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(blocks, key=lambda b: b["type"] != "tool_result")


def _wire_tool(tool: ModelTool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


def _turn(doc: dict[str, Any], model: str, pricing: Pricing) -> Turn:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for i, raw in enumerate(_parse.field_list(doc, "content", "response", model)):
        where = f"content[{i}]"
        block = _parse.as_dict(raw, where, model)
        match _parse.field_str(block, "type", where, model):
            case "text":
                texts.append(_parse.field_str(block, "text", where, model))
            case "tool_use":
                calls.append(_tool_call(block, where, model))
            case other:
                raise ModelBadResponse(model, f"{where} has unknown type {other!r}")
    usage = _parse.optional_dict(doc, "usage")
    return Turn(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=pricing.usage(
            _parse.token_count(usage, "input_tokens"), _parse.token_count(usage, "output_tokens")
        ),
        stop_reason=str(doc.get("stop_reason") or ""),
    )


def _tool_call(block: dict[str, Any], where: str, model: str) -> ToolCall:
    call_id = _parse.field_str(block, "id", where, model)
    name = _parse.field_str(block, "name", where, model)
    return ToolCall(call_id, name, _parse.field_dict(block, "input", where, model))
