"""`ScriptedModel`: a model that plays a script, for tests of anything that drives a model.

    model = ScriptedModel([
        ScriptedModel.calls(("read_file", {"path": "a.txt"})),
        lambda messages: ScriptedModel.answer(messages[-1].results[0].content),
    ])

A step is a `Turn`, or a callable given the messages that returns one (to react to the
results the loop sent back). The script is any iterable, read one step per `respond` (an
endless `itertools.repeat(...)` is fine). Calls without an id get "call_1", "call_2", ...
unique across the script. Past the last step, `respond` raises `ScriptExhausted`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .base import Message, ModelTool, Pricing, ToolCall, Turn, Usage
from .errors import ScriptExhausted

# Frozen, so safe to share as a default.
_FREE = Pricing()
_NO_USAGE = Usage()

Step = Turn | Callable[[Sequence[Message]], Turn]


class ScriptedModel:
    """Plays `script` one step per `respond`; records what it was asked."""

    def __init__(
        self, script: Iterable[Step], *, name: str = "scripted", pricing: Pricing = _FREE
    ) -> None:
        """Args:
        script: the steps, in order; read lazily, one per `respond`.
        name: the model's name (in errors, and for the loop's records).
        pricing: when not zero, each turn's cost is computed from its tokens; when zero,
            the step's own `usage.cost` is kept.
        """
        self.name = name
        self.pricing = pricing
        self._script = iter(script)
        # Steps played so far; `remaining` is known only for a sized script.
        self._played = 0
        self._size = len(script) if isinstance(script, Sequence) else None
        self._ids_used: set[str] = set()
        self._id_counter = 0
        # One entry per respond() call, in order: the messages, tools and system prompt seen.
        self.requests: list[tuple[Message, ...]] = []
        self.tools_offered: list[tuple[ModelTool, ...]] = []
        self.systems: list[str] = []

    @staticmethod
    def calls(*calls: tuple[str, dict[str, Any]], usage: Usage = _NO_USAGE, text: str = "") -> Turn:
        """A turn proposing these (name, arguments) calls; ids are assigned when played."""
        return Turn(
            text=text,
            tool_calls=tuple(ToolCall("", name, dict(args)) for name, args in calls),
            usage=usage,
            stop_reason="tool_calls",
        )

    @staticmethod
    def answer(text: str, *, usage: Usage = _NO_USAGE, stop_reason: str = "stop") -> Turn:
        """A turn with text and no calls: a final answer unless `stop_reason` says the
        turn was cut off ("length"), refused ("refusal") or paused ("pause_turn")."""
        return Turn(text=text, tool_calls=(), usage=usage, stop_reason=stop_reason)

    @property
    def remaining(self) -> int | None:
        """Steps not yet played; None when the script is not a sized sequence."""
        return None if self._size is None else self._size - self._played

    def respond(
        self, messages: Sequence[Message], tools: Sequence[ModelTool], *, system: str = ""
    ) -> Turn:
        self.requests.append(tuple(messages))
        self.tools_offered.append(tuple(tools))
        self.systems.append(system)
        step = next(self._script, None)
        if step is None:
            raise ScriptExhausted(self.name, self._played)
        self._played += 1
        turn = step if isinstance(step, Turn) else step(tuple(messages))
        return self._finish(turn)

    def _finish(self, turn: Turn) -> Turn:
        calls = tuple(self._with_id(c) for c in turn.tool_calls)
        usage = turn.usage
        if self.pricing != _FREE:
            usage = self.pricing.usage(usage.input_tokens, usage.output_tokens)
        return dataclasses.replace(turn, tool_calls=calls, usage=usage)

    def _with_id(self, call: ToolCall) -> ToolCall:
        if not call.id:
            call = dataclasses.replace(call, id=self._fresh_id())
        self._ids_used.add(call.id)
        return call

    def _fresh_id(self) -> str:
        while True:
            self._id_counter += 1
            candidate = f"call_{self._id_counter}"
            if candidate not in self._ids_used:
                return candidate
