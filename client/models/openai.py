"""`OpenAIChatModel`: the OpenAI Chat Completions API, and servers that speak it.

vLLM, llama.cpp's server and Ollama serve the same API: point `base_url` at them (see
docs/models.md). Wire rules followed:

- tools: `{"type": "function", "function": {"name", "description", "parameters"}}`;
- the system prompt is the first message, role "system";
- an assistant turn with calls: `{"role": "assistant", "content": text or None,
  "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}`, the
  arguments as a JSON string;
- tool results: one `{"role": "tool", "tool_call_id", "content"}` message per result, in the
  order of the assistant's tool_calls, right after it. The API has no error flag, so an
  error result's content is prefixed with `ERROR_PREFIX`. Text on a tool_results message
  follows the tool messages as a user message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from . import _parse
from ._http import post_json
from .base import Message, ModelTool, Pricing, ToolCall, ToolResult, Turn
from .errors import ModelBadResponse

# Frozen, so safe to share as a default.
_FREE = Pricing()

# What an error result's content starts with on the wire (the API has no is_error).
ERROR_PREFIX = "ERROR: "


class OpenAIChatModel:
    """A chat model behind POST {base_url}/chat/completions."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        pricing: Pricing = _FREE,
        timeout: float = 60.0,
        max_tokens: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        """Args:
        model: the provider's model name, sent as "model"; also this object's `name`.
        base_url: the API root, up to and including /v1.
        api_key: sent as a Bearer token; None reads OPENAI_API_KEY; "" sends none.
        pricing: prices per million tokens, for `Usage.cost`.
        timeout: seconds for the connection and for the answer.
        max_tokens: sent as "max_tokens" when set.
        extra_body: merged into the request body last (temperature, seed, ...).
        """
        self.name = model
        self.base_url = base_url.rstrip("/")
        self.pricing = pricing
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        self._api_key = os.environ.get("OPENAI_API_KEY", "") if api_key is None else api_key

    def __repr__(self) -> str:
        return f"OpenAIChatModel({self.name!r}, base_url={self.base_url!r})"

    def respond(
        self, messages: Sequence[Message], tools: Sequence[ModelTool], *, system: str = ""
    ) -> Turn:
        headers = {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        doc = post_json(
            f"{self.base_url}/chat/completions",
            self._body(messages, tools, system),
            headers=headers,
            model=self.name,
            timeout=self.timeout,
            secret=self._api_key,
        )
        return _turn(doc, self.name, self.pricing)

    def _body(
        self, messages: Sequence[Message], tools: Sequence[ModelTool], system: str
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.name, "messages": wire_messages(messages, system)}
        if tools:
            body["tools"] = [_wire_tool(t) for t in tools]
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        return body


def wire_messages(messages: Sequence[Message], system: str = "") -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages."""
    wire: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    calls: tuple[ToolCall, ...] = ()
    for message in messages:
        match message.role:
            case "user":
                wire.append({"role": "user", "content": message.text})
            case "assistant":
                wire.append(_wire_assistant(message))
                calls = message.tool_calls
            case "tool_results":
                wire.extend(_wire_result(r) for r in _parse.in_call_order(message.results, calls))
                if message.text:
                    wire.append({"role": "user", "content": message.text})
    return wire


def _wire_assistant(message: Message) -> dict[str, Any]:
    if not message.tool_calls:
        return {"role": "assistant", "content": message.text}
    return {
        "role": "assistant",
        "content": message.text or None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in message.tool_calls
        ],
    }


def _wire_result(result: ToolResult) -> dict[str, Any]:
    content = ERROR_PREFIX + result.content if result.is_error else result.content
    return {"role": "tool", "tool_call_id": result.call_id, "content": content}


def _wire_tool(tool: ModelTool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def _turn(doc: dict[str, Any], model: str, pricing: Pricing) -> Turn:
    choices = _parse.field_list(doc, "choices", "response", model)
    if not choices:
        raise ModelBadResponse(model, "response.choices is empty")
    choice = _parse.as_dict(choices[0], "choices[0]", model)
    message = _parse.field_dict(choice, "message", "choices[0]", model)
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ModelBadResponse(model, f"message.content is a {type(content).__name__}")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ModelBadResponse(model, "message.tool_calls is not a list")
    usage = _parse.optional_dict(doc, "usage")
    stop_reason = str(choice.get("finish_reason") or "")
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:  # a refusal says "stop", yet is no answer
        content, stop_reason = refusal, "refusal"
    return Turn(
        text=content or "",
        tool_calls=tuple(_tool_call(c, i, model) for i, c in enumerate(raw_calls)),
        usage=pricing.usage(
            _parse.token_count(usage, "prompt_tokens"),
            _parse.token_count(usage, "completion_tokens"),
        ),
        stop_reason=stop_reason,
    )


def _tool_call(raw: Any, index: int, model: str) -> ToolCall:
    where = f"message.tool_calls[{index}]"
    call = _parse.as_dict(raw, where, model)
    if call.get("type", "function") != "function":
        raise ModelBadResponse(model, f"{where} has unknown type {call.get('type')!r}")
    call_id = _parse.field_str(call, "id", where, model)
    function = _parse.field_dict(call, "function", where, model)
    name = _parse.field_str(function, "name", f"{where}.function", model)
    arguments = function.get("arguments")
    if isinstance(arguments, dict):  # some local servers send an object
        return ToolCall(call_id, name, arguments)
    if not isinstance(arguments, str):
        raise ModelBadResponse(model, f"tool call {call_id!r}: arguments is not a string")
    return ToolCall(call_id, name, _parse.json_arguments(arguments, call_id, model))
