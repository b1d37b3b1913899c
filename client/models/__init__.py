"""Models the client loop can drive: one interface, a scripted fake, two HTTP adapters.

    from execgate.client.models import Message, OpenAIChatModel
    model = OpenAIChatModel("gpt-4o-mini")
    turn = model.respond([Message("user", text="hello")], tools=[])

`Model.respond(messages, tools, system=...)` returns a `Turn` (text, proposed tool calls,
usage). Adapters use only the standard library; see docs/models.md.
"""

from .anthropic import AnthropicMessagesModel
from .base import Message, Model, ModelTool, Pricing, ToolCall, ToolResult, Turn, Usage
from .errors import (
    ModelBadResponse,
    ModelError,
    ModelRateLimited,
    ModelRequestRejected,
    ModelUnavailable,
    ScriptExhausted,
)
from .openai import OpenAIChatModel
from .scripted import ScriptedModel

__all__ = [
    "AnthropicMessagesModel",
    "Message",
    "Model",
    "ModelBadResponse",
    "ModelError",
    "ModelRateLimited",
    "ModelRequestRejected",
    "ModelTool",
    "ModelUnavailable",
    "OpenAIChatModel",
    "Pricing",
    "ScriptExhausted",
    "ScriptedModel",
    "ToolCall",
    "ToolResult",
    "Turn",
    "Usage",
]
