"""The model interface the client loop talks to, in the project's own types.

A `Model` turns a conversation (a sequence of `Message`s) and the tools on offer into one
`Turn`: text, the tool calls it proposes, and what the turn used. Adapters translate these
types to one provider's wire format and back; nothing provider-shaped leaks out of them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model proposes. `id` is the provider's (e.g. "call_abc", "toolu_01...")."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What goes back to the model for one proposed call."""

    call_id: str
    # Bounded text the loop prepared.
    content: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a conversation.

    `tool_calls` belong to assistant turns only; `results` to tool_results messages only,
    which hold ALL the results of one assistant turn together.
    """

    role: Literal["user", "assistant", "tool_results"]
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    results: tuple[ToolResult, ...] = ()

    def __post_init__(self) -> None:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role} message cannot carry tool calls")
        if self.results and self.role != "tool_results":
            raise ValueError(f"a {self.role} message cannot carry tool results")


@dataclass(frozen=True, slots=True)
class ModelTool:
    """A tool offered to the model; `parameters` is a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    # In the caller's currency unit, from `Pricing`.
    cost: float = 0.0


@dataclass(frozen=True, slots=True)
class Pricing:
    """Prices per million tokens, in the caller's currency unit."""

    input: float = 0.0
    output: float = 0.0

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000

    def usage(self, input_tokens: int, output_tokens: int) -> Usage:
        """The `Usage` of a turn that used these tokens, priced."""
        return Usage(input_tokens, output_tokens, self.cost(input_tokens, output_tokens))


class Ending(enum.StrEnum):
    """Why a turn stopped, in the project's terms (the provider's words: `Turn.stop_reason`).

    Only `END` can end a run `completed`; every other kind has its own path in the loop
    (docs/loop.md, "Why a turn stopped").
    """

    # The model ended its turn itself: "stop", "end_turn", "stop_sequence".
    END = "end"
    # It stopped to have tools run: "tool_calls", "tool_use", "function_call".
    TOOL_USE = "tool_use"
    # It paused a long turn and should be asked to go on: Anthropic's "pause_turn".
    PAUSED = "paused"
    # Cut off by a length bound: "length", "max_tokens", "model_context_window_exceeded".
    TRUNCATED = "truncated"
    # The provider refused or filtered it: "refusal", "content_filter".
    REFUSED = "refused"
    # A reason this client does not know: never taken for an answer.
    UNKNOWN = "unknown"


# The providers' reasons, lower-cased. "" (a server that says nothing) counts as END: the
# turn's calls, if any, decide what it is.
ENDINGS: dict[str, Ending] = {
    "": Ending.END,
    "stop": Ending.END,
    "end_turn": Ending.END,
    "stop_sequence": Ending.END,
    "tool_calls": Ending.TOOL_USE,
    "tool_use": Ending.TOOL_USE,
    "function_call": Ending.TOOL_USE,
    "pause_turn": Ending.PAUSED,
    "length": Ending.TRUNCATED,
    "max_tokens": Ending.TRUNCATED,
    "model_context_window_exceeded": Ending.TRUNCATED,
    "refusal": Ending.REFUSED,
    "content_filter": Ending.REFUSED,
}


def ending_of(stop_reason: str) -> Ending:
    """The kind of a provider's stop reason; `UNKNOWN` for one not in `ENDINGS`."""
    return ENDINGS.get(stop_reason.strip().lower(), Ending.UNKNOWN)


@dataclass(frozen=True, slots=True)
class Turn:
    """One response of a model."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    # The provider's finish/stop reason, verbatim ("tool_calls", "end_turn", ...).
    stop_reason: str = ""

    @property
    def ending(self) -> Ending:
        return ending_of(self.stop_reason)

    @property
    def final(self) -> bool:
        """A final answer: no calls proposed and the model ended the turn itself. Still
        a proposal; the loop verifies it."""
        return not self.tool_calls and self.ending is Ending.END


class Model(Protocol):
    """What the loop needs of a model: a name and one method."""

    name: str

    def respond(
        self, messages: Sequence[Message], tools: Sequence[ModelTool], *, system: str = ""
    ) -> Turn:
        """The model's next turn in this conversation.

        Raises:
            ModelError: a subclass saying what went wrong (see `errors`).
        """
        ...
