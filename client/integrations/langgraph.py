"""A LangGraph node that runs a turn's tool calls as one execgate batch (`pip install
'execgate[langgraph]'`).

    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition
    from execgate.client.integrations.langgraph import ExecgateToolNode

    tools = await ExecgateToolNode.load(eg)                 # eg: an AsyncClient
    model = chat_model.bind_tools(tools.tool_definitions)   # what ListTools serves
    graph = StateGraph(MessagesState)
    graph.add_node("agent", call_model)                     # model.ainvoke(messages)
    graph.add_node("tools", tools)                          # instead of ToolNode
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")

The node takes the last AI message's tool calls, sends them as ONE batch (so the
daemon's scheduler sees the whole turn: conflicting writes keep the order the model
proposed them, independent reads still run together) and answers each with a
`ToolMessage`: the outcome rendered with its status and error class, `status="error"`
for anything but success or partial, and `artifact` the outcome's ids and class. The
tool-call id is the execgate call id (and, prefixed with the run id, its idempotency
key). A call a policy `ask` rule parks is written to the graph's custom stream
(`stream_mode="custom"`: `{"execgate": "awaiting_approval", ...}`) and to `on_event`
while it waits. Cancelling the graph's run cancels the batch at the daemon.

Why a node and not an `awrap_tool_call` wrapper for the prebuilt `ToolNode`: ToolNode
calls the wrapper once per tool call, each in its own coroutine with its own `execute`;
one batch per turn would need the siblings to meet and elect a sender, which rests on
how ToolNode happens to schedule them. A node is handed the whole turn. Async graphs
only (`ainvoke`, `astream`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .._async import AsyncClient
from ..loop.observe import DEFAULT_CAP
from ..types import Call, Event, EventKind, Outcome
from ._gate import EventHook, Gate, GateTool, model_names

try:
    from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
    from langgraph.config import get_stream_writer
except ModuleNotFoundError as exc:
    if (exc.name or "").partition(".")[0] not in ("langchain_core", "langgraph"):
        raise
    raise ModuleNotFoundError(
        "execgate.client.integrations.langgraph needs LangGraph: pip install 'execgate[langgraph]'"
    ) from exc

__all__ = ["ExecgateToolNode"]


class ExecgateToolNode:
    """The daemon's tools for one graph's runs: `tool_definitions` to bind to the chat
    model, and the node itself (`await node(state)`) to execute a turn.

    Build with `await ExecgateToolNode.load(client)`. `messages_key` is the state's
    key of the message list (a list state is used as the list itself).
    """

    def __init__(
        self, gate: Gate, tools: Iterable[GateTool], *, messages_key: str = "messages"
    ) -> None:
        self.gate = gate
        self.messages_key = messages_key
        self.tools = list(tools)
        self._names = {t.name: t.spec.name for t in self.tools}

    @classmethod
    async def load(
        cls,
        client: AsyncClient,
        *,
        run_id: str | None = None,
        only: Iterable[str] | None = None,
        on_event: EventHook | None = None,
        cap: int = DEFAULT_CAP,
        messages_key: str = "messages",
    ) -> ExecgateToolNode:
        """The tools `ListTools` serves (those named in `only`, if given); the
        arguments as for `execgate.client.integrations.openai_agents.ExecgateTools`."""
        gate = Gate(client, run_id=run_id, on_event=on_event, cap=cap)
        tools = model_names(await client.list_tools(), only)
        return cls(gate, tools, messages_key=messages_key)

    @property
    def run_id(self) -> str:
        return self.gate.run_id

    @property
    def tool_definitions(self) -> list[dict[str, Any]]:
        """The tools in the OpenAI function format, which `bind_tools` takes as they are."""
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.spec.description,
                    "parameters": dict(t.spec.input_schema),
                },
            }
            for t in self.tools
        ]

    async def __call__(self, state: Any) -> dict[str, list[ToolMessage]] | list[ToolMessage]:
        proposed = _last_ai_message(self._messages(state))
        # Calls whose arguments did not parse go to the daemon too, as the text the model
        # wrote: it refuses them (invalid_argument, journaled) and the model reads why.
        raw: list[tuple[str, Any, str | None]] = [
            (c["name"], c["args"], c["id"]) for c in proposed.tool_calls
        ] + [(c["name"] or "", c["args"] or "", c["id"]) for c in proposed.invalid_tool_calls]
        calls = [self.gate.call(self._names.get(name, name), args, id_) for name, args, id_ in raw]
        outcomes = await self.gate.run(calls, also=_custom_stream()) if calls else []
        replies = [
            self._reply(c, o, name) for c, o, (name, _, _) in zip(calls, outcomes, raw, strict=True)
        ]
        return replies if isinstance(state, list) else {self.messages_key: replies}

    def _messages(self, state: Any) -> Sequence[AnyMessage]:
        if isinstance(state, list):
            return state
        if isinstance(state, dict):
            return list(state.get(self.messages_key, []))
        return list(getattr(state, self.messages_key, []))

    def _reply(self, call: Call, outcome: Outcome, name: str) -> ToolMessage:
        seen = self.gate.observe(outcome, call.tool)
        return ToolMessage(
            content=seen.render(),
            tool_call_id=call.call_id,
            name=name,
            status="error" if seen.is_error else "success",
            artifact={
                "run_id": self.gate.run_id,
                "call_id": outcome.call_id,
                "status": outcome.status.value,
                "error_class": outcome.error_class,
                "replay_of": outcome.replay_of,
            },
        )


def _last_ai_message(messages: Sequence[AnyMessage]) -> AIMessage:
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return message
    raise ValueError("ExecgateToolNode: the state holds no AI message to take tool calls from")


def _custom_stream() -> EventHook | None:
    """The graph's custom stream writer, as an event hook for approval waits; None
    outside a graph run."""
    try:
        writer = get_stream_writer()
    except RuntimeError:  # called outside a runnable context (a direct `await node(...)`)
        return None

    def write(event: Event) -> None:
        if event.kind is EventKind.AWAITING_APPROVAL:
            writer(
                {
                    "execgate": event.kind.value,
                    "call_id": event.call_id,
                    "approval_id": event.approval_id,
                    "rule_id": event.rule_id,
                    "reason": event.reason,
                    "expires_at": event.expires_at,
                }
            )

    return write
