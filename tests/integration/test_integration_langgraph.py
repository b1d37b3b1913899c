"""execgate.client.integrations.langgraph with the real LangGraph and langchain-core,
offline: a fake chat model (langchain-core's `GenericFakeChatModel`) returns scripted tool
calls, a real `StateGraph` routes them (`tools_condition`) to the node, and every turn
goes to a real daemon as one batch (declared tools in the real sandbox, identities, a
policy that denies and asks)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from execgate.client import AsyncClient, Event, EventKind, Outcome, Status, StopMode
from execgate.client.integrations.langgraph import ExecgateToolNode
from tests.daemon import Daemon, scaled
from tests.framework_support import (
    Span,
    all_overlap,
    counter,
    journaled,
    none_overlap,
    overlap,
    run_natively,
    span,
    start_framework_daemon,
)
from tests.loop_support import TOKENS, stop
from tests.mcp_support import await_for

N = 6  # increments of one file proposed in one turn


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_framework_daemon(tmp_path_factory.mktemp("langgraph"))
    yield d
    stop(d)


def bot(daemon: Daemon) -> AsyncClient:
    return AsyncClient(daemon.address, token=TOKENS["bot"])


def proposes(*calls: tuple[str, dict[str, Any], str]) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for n, a, i in calls],
    )


def graph(node: Any, *turns: AIMessage) -> Any:
    """model -> tools -> model ... with the scripted turns, then a final answer."""
    model = GenericFakeChatModel(messages=iter([*turns, AIMessage(content="done")]))

    async def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile()


async def run_graph(node: Any, *turns: AIMessage) -> list[ToolMessage]:
    state = await graph(node, *turns).ainvoke({"messages": [HumanMessage("go")]})
    assert state["messages"][-1].content == "done"
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_the_tool_definitions_are_what_list_tools_serves(daemon: Daemon) -> None:
    async def main() -> None:
        async with bot(daemon) as eg:
            specs = {s.name: s for s in await eg.list_tools()}
            node = await ExecgateToolNode.load(eg)
        defined = {d["function"]["name"]: d for d in node.tool_definitions}
        # The MCP server's `faulty.echo` is defined as `faulty_echo`: no dots in a name.
        assert "faulty.echo" in specs
        named = {name.replace(".", "_"): spec for name, spec in specs.items()}
        assert set(defined) == set(named)
        for name, d in defined.items():
            assert d["function"]["parameters"] == named[name].input_schema
            assert d["function"]["description"] == named[name].description
            assert convert_to_openai_tool(d) == d  # bind_tools takes them as they are

    asyncio.run(main())


def test_a_turn_is_one_batch_writes_in_proposal_order_reads_together(daemon: Daemon) -> None:
    (daemon.workspace / "notes.txt").write_text("notes\n")
    turn = proposes(
        ("append", {"path": "order.txt", "tag": "first,"}, "call_a1"),
        ("peek", {"path": "notes.txt"}, "call_p1"),
        ("append", {"path": "order.txt", "tag": "second,"}, "call_a2"),
        ("peek", {"path": "notes.txt"}, "call_p2"),
        ("append", {"path": "order.txt", "tag": "third"}, "call_a3"),
    )

    async def main() -> tuple[ExecgateToolNode, list[ToolMessage], list[Any]]:
        async with bot(daemon) as eg:
            node = await ExecgateToolNode.load(eg)
            replies = await run_graph(node, turn)
            ids = [c["id"] for c in turn.tool_calls]
            records = [await eg.get_call(i, run_id=node.run_id) for i in ids]
        return node, replies, records

    node, replies, records = asyncio.run(main())
    assert (daemon.workspace / "order.txt").read_text() == "first,second,third"
    assert [r.tool_call_id for r in replies] == [c["id"] for c in turn.tool_calls]
    assert all(r.status == "success" and r.content.startswith("[success]") for r in replies)
    assert replies[1].content == "[success]\nnotes\n"
    assert replies[0].artifact == {
        "run_id": node.run_id,
        "call_id": "call_a1",
        "status": "success",
        "error_class": "none",
        "replay_of": "",
    }
    assert len({r.batch_id for r in records}) == 1  # one ExecuteBatch for the turn
    assert all(r.idempotency_key == f"{node.run_id}:{r.call_id}" for r in records)
    appends = [span(r.outcome) for r in records if r.tool == "append"]
    peeks = [span(r.outcome) for r in records if r.tool == "peek"]
    assert none_overlap(appends)
    assert appends == sorted(appends, key=lambda s: s.started)
    assert all_overlap(peeks)


def test_an_mcp_servers_tool_is_called_by_the_name_the_model_was_given(daemon: Daemon) -> None:
    async def main() -> tuple[list[ToolMessage], Any]:
        async with bot(daemon) as eg:
            node = await ExecgateToolNode.load(eg)
            replies = await run_graph(node, proposes(("faulty_echo", {"text": "hi"}, "call_m")))
            return replies, await eg.get_call("call_m", run_id=node.run_id)

    [reply], record = asyncio.run(main())
    assert (reply.name, reply.content, reply.status) == ("faulty_echo", "[success]\nhi", "success")
    assert record.tool == "faulty.echo"


def test_a_denial_and_unparsable_arguments_are_error_messages(daemon: Daemon) -> None:
    turn = AIMessage(
        content="",
        tool_calls=[{"name": "danger", "args": {}, "id": "call_d", "type": "tool_call"}],
        invalid_tool_calls=[
            {
                "name": "peek",
                "args": '{"path": ',
                "id": "call_bad",
                "error": "not JSON",
                "type": "invalid_tool_call",
            }
        ],
    )

    async def main() -> list[ToolMessage]:
        async with bot(daemon) as eg:
            node = await ExecgateToolNode.load(eg)
            replies = await node([HumanMessage("go"), turn])  # a list state, outside a graph
        assert isinstance(replies, list)
        return replies

    denied, bad = asyncio.run(main())
    assert (denied.tool_call_id, denied.status) == ("call_d", "error")
    assert denied.content.startswith("[rejected: policy_denied] do not retry")
    assert (bad.tool_call_id, bad.name, bad.status) == ("call_bad", "peek", "error")
    assert bad.content.startswith("[rejected: invalid_argument] fix the arguments")


def test_an_approval_wait_reaches_the_graphs_custom_stream(daemon: Daemon) -> None:
    turn = proposes(("careful", {}, "call_c"))
    custom: list[dict[str, Any]] = []
    replies: list[ToolMessage] = []

    async def approve_the_first(human: AsyncClient) -> str:
        async for approval in human.watch_approvals():
            if approval.state.value == "pending" and approval.call_id == "call_c":
                await human.approve(approval.approval_id, "fine")
                return approval.approval_id
        raise AssertionError("the approvals stream ended")

    async def main() -> str:
        async with bot(daemon) as eg, AsyncClient(daemon.address, token=TOKENS["alice"]) as alice:
            node = await ExecgateToolNode.load(eg)
            async with asyncio.timeout(scaled(30)), asyncio.TaskGroup() as tg:
                approver = tg.create_task(approve_the_first(alice))
                stream = graph(node, turn).astream(
                    {"messages": [HumanMessage("go")]}, stream_mode=["custom", "updates"]
                )
                async for mode, chunk in stream:
                    if mode == "custom":
                        custom.append(chunk)
                    elif "tools" in chunk:
                        replies.extend(chunk["tools"]["messages"])
        return approver.result()

    approval_id = asyncio.run(main())
    assert [(c["execgate"], c["call_id"], c["approval_id"], c["rule_id"]) for c in custom] == [
        ("awaiting_approval", "call_c", approval_id, "ask-careful")
    ]
    assert custom[0]["reason"] == "a person looks first"
    assert [r.content for r in replies] == ["[success]\ncarefully done\n"]


def test_cancelling_the_graph_cancels_the_batch_at_the_daemon(daemon: Daemon) -> None:
    events: list[Event] = []

    def started() -> bool:
        return any(e.kind is EventKind.STARTED and e.call_id == "call_s" for e in events)

    async def main() -> Outcome:
        async with bot(daemon) as eg:
            node = await ExecgateToolNode.load(eg, on_event=events.append)
            run = asyncio.create_task(run_graph(node, proposes(("slow", {}, "call_s"))))
            await await_for(started, 20, "the slow call started")
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            return await journaled(eg, "call_s", node.run_id)

    outcome = asyncio.run(main())
    assert (outcome.status, outcome.error_class) == (Status.FAILURE, "cancelled"), outcome
    assert outcome.stopped_how in (StopMode.COOPERATIVE, StopMode.FORCE_TERMINATED)
    assert outcome.mark("finished").at - outcome.mark("started").at < 30  # not its 60 s


# ------------------------------------------------------------------ the demonstration


def the_turn(path: str) -> AIMessage:
    """N increments of `path` and three reads of notes.txt, in one turn."""
    calls = [("increment", {"path": path}, f"call_inc{i}") for i in range(N)]
    calls += [("peek", {"path": "notes.txt"}, f"call_peek{i}") for i in range(3)]
    return proposes(*calls)


def native_tools(workspace: Path, spans: dict[str, list[Span]]) -> list[BaseTool]:
    """The same two tools for the prebuilt ToolNode: the same programs, in the workspace."""

    @tool
    async def increment(path: str) -> str:
        """Add one to the integer in a file."""
        spans["increment"].append(s := await run_natively(workspace, "increment", path=path))
        return s.output

    @tool
    async def peek(path: str) -> str:
        """Print a file."""
        spans["peek"].append(s := await run_natively(workspace, "peek", path=path))
        return s.output

    return [increment, peek]


def test_concurrent_increments_lose_updates_natively_and_none_through_execgate(
    daemon: Daemon,
) -> None:
    (daemon.workspace / "notes.txt").write_text("notes\n")
    native, gated = counter(daemon, "native.txt"), counter(daemon, "gated.txt")
    spans: dict[str, list[Span]] = {"increment": [], "peek": []}
    finished: list[Outcome] = []

    def keep(event: Event) -> None:
        if event.kind is EventKind.FINISHED and event.outcome is not None:
            finished.append(event.outcome)

    async def main() -> None:
        await run_graph(ToolNode(native_tools(daemon.workspace, spans)), the_turn("native.txt"))
        async with bot(daemon) as eg:
            node = await ExecgateToolNode.load(eg, on_event=keep)
            await run_graph(node, the_turn("gated.txt"))

    asyncio.run(main())
    # LangGraph's ToolNode alone: the increments ran at once and lost updates.
    lost_natively = N - int(native.read_text())
    assert lost_natively >= 1, native.read_text()
    assert any(overlap(a, b) for a in spans["increment"] for b in spans["increment"] if a != b)
    # Through execgate: every increment counted, one at a time; the reads together.
    assert int(gated.read_text()) == N
    assert all(o.status is Status.SUCCESS for o in finished), finished
    incs = [span(o) for o in finished if o.call_id.startswith("call_inc")]
    peeks = [span(o) for o in finished if o.call_id.startswith("call_peek")]
    assert (len(incs), len(peeks)) == (N, 3)
    assert none_overlap(incs)
    read = {o.call_id: o.text for o in finished}
    # One batch keeps proposal order: the i-th increment read i.
    assert [read[f"call_inc{i}"] for i in range(N)] == [f"read {i}\n" for i in range(N)]
    assert all_overlap(peeks)
    assert any(overlap(p, i) for p in peeks for i in incs)
