"""N concurrent increments of one file in one turn, with LangGraph: run by the prebuilt
ToolNode, then through execgate.

    python examples/frameworks/langgraph_increments.py [-n 6] [--addr ADDR --workspace DIR]

One model turn proposes N `increment`s of a counter file and three `peek`s of notes.txt
(tools.yaml beside this file). The prebuilt ToolNode runs a turn's tool calls
concurrently: the increments all read the counter before any writes it back, and
updates are lost. Through execgate (`ExecgateToolNode` in the graph instead: the same
tools, the same turn) the turn goes to the daemon as one batch; it knows each increment
writes that file, so they run one at a time in the order proposed and none is lost,
while the peeks, which only read, still run together. langchain-core's
`GenericFakeChatModel` plays the model: no API key, no network.

Needs `pip install 'execgate[daemon,langgraph]'`. Without --addr it starts a private
daemon with this folder's tools.yaml and policy.yaml; exit status 1 if execgate lost an
update, 2 if no daemon answers.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any

from common import Ran, Timeline, arguments, counter, daemon, notes, report, run_natively
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from execgate.client import AsyncClient, DaemonUnavailable
from execgate.client.integrations.langgraph import ExecgateToolNode


def the_turn(n: int, path: str) -> AIMessage:
    calls = [("increment", path, f"inc{i}") for i in range(n)]
    calls += [("peek", "notes.txt", f"peek{i}") for i in range(3)]
    return AIMessage(
        content="",
        tool_calls=[
            {"name": t, "args": {"path": p}, "id": i, "type": "tool_call"} for t, p, i in calls
        ],
    )


async def run(tools_node: Any, turn: AIMessage) -> None:
    """A graph: model -> tools -> model, the model scripted (one turn, then an answer)."""
    model = GenericFakeChatModel(messages=iter([turn, AIMessage(content="done")]))

    async def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools_node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    await graph.compile().ainvoke({"messages": [HumanMessage("count")]})


def native_tools(workspace: Path, ran: list[Ran]) -> list[BaseTool]:
    """increment and peek as LangChain tools for the prebuilt ToolNode: the same programs."""

    @tool
    async def increment(path: str, call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Add one to the integer in a file."""
        return await run_natively(workspace, call_id, path, ran)

    @tool
    async def peek(path: str, call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Print a file."""
        return await run_natively(workspace, call_id, path, ran)

    return [increment, peek]


async def main() -> int:
    args = arguments(__doc__ or "")
    with daemon(args) as (address, workspace):
        notes(workspace)
        ran: list[Ran] = []
        native = counter(workspace, "counter-toolnode.txt")
        await run(ToolNode(native_tools(workspace, ran)), the_turn(args.n, native.name))
        report("run by LangGraph's ToolNode itself:", args.n, native, ran)

        gated, timeline = counter(workspace, "counter-execgate.txt"), Timeline()
        async with AsyncClient(address, token=args.token) as eg:
            node = await ExecgateToolNode.load(eg, on_event=timeline)
            await run(node, the_turn(args.n, gated.name))
        lost = report("through execgate:", args.n, gated, timeline.ran)
    return 1 if lost else 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except DaemonUnavailable as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
