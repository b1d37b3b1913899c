"""What execgate adds to one tool call made from an agent framework.

Per framework, a no-op tool executed by the framework itself, in process, against the
same tool executed through execgate (the adapter of execgate.client.integrations and the
real daemon: `noop`, read-only, served with --test-tools), interleaved in rounds on this
(small, shared) machine:

  openai-agents invoke   the SDK's function-tool runtime for one call
                         (`FunctionTool.on_invoke_tool`): a `@function_tool` returning its
                         argument against `ExecgateTools`' tool (one Execute stream, the
                         outcome rendered); beside them the bare `AsyncClient.stream` of
                         the same call, once as the adapter sends it (idempotency key,
                         batch id, progress events) and once outcomes-only without a key
                         (the cheapest Execute), which split the added time into the
                         daemon round trip, what the adapter's request adds, and the
                         adapter's own code
  openai-agents turn     a whole `Runner.run` of the SDK's ScriptedModel proposing that one
                         call, then answering: what a user's turn sees
  langgraph node         a one-node compiled graph (START -> tools -> END) given an AI
                         message with that one call: the prebuilt `ToolNode` with a
                         langchain `@tool` against `ExecgateToolNode`

Each round's p50/p99 are computed per case; the median round is reported with the added
milliseconds (p50 and p99) against the framework's own execution (goal: <= 2 ms added
for a read-only call at p50), and "others N cores", the CPU the rest of the machine used
meanwhile. Results, with every round, go to bench/results/frameworks.json (git-ignored).
The exit status reflects breakage only (a call that did not succeed, a daemon that
died), never a time.

    python bench/frameworks.py            # full run, about a minute
    python bench/frameworks.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/frameworks.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

from agents import Agent, FunctionTool, RunConfig, Runner, function_tool  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402

from bench.dispatch import environment  # noqa: E402
from bench.tools import Fn, median_round, rounds_of  # noqa: E402
from execgate.client import AsyncClient, Call, EventKind  # noqa: E402
from execgate.client.integrations.langgraph import ExecgateToolNode  # noqa: E402
from execgate.client.integrations.openai_agents import ExecgateTools  # noqa: E402
from tests.daemon import Daemon  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "frameworks.json"
GOAL_ADDED_P50_MS = 2.0
ECHO = "x"
ARGS = json.dumps({"echo": ECHO})
OFFLINE = RunConfig(tracing_disabled=True)
_ids = itertools.count()


class BenchError(Exception):
    """Something broke (not: something was slow)."""


def next_id() -> str:
    # Every call its own id: a repeated one would be answered from the journal.
    return f"call{next(_ids)}"


def expect(output: object, want: str) -> None:
    if str(output) != want:
        raise BenchError(f"the tool answered {output!r}, not {want!r}")


# ------------------------------------------------------------------ openai-agents


@function_tool
async def noop(echo: str) -> str:
    """Return `echo` unchanged."""
    return echo


def invoke(tool: FunctionTool, want: str) -> Fn:
    async def one() -> None:
        call_id = next_id()
        ctx = ToolContext(None, tool_name="noop", tool_call_id=call_id, tool_arguments=ARGS)
        expect(await tool.on_invoke_tool(ctx, ARGS), want)

    return one


def bare_stream(client: AsyncClient, *, like_the_adapter: bool) -> Fn:
    """The Execute of the call without the adapter: the same request as the adapter's
    (idempotency key, batch id, progress events), or the cheapest one (outcomes only)."""

    async def one() -> None:
        call_id = next_id()
        key, batch = (f"bench:{call_id}", f"batch-{call_id}") if like_the_adapter else ("", "")
        call = Call(tool="noop", arguments=ARGS, call_id=call_id, idempotency_key=key)
        async for event in client.stream(
            [call], run_id="bench-frameworks", batch_id=batch, progress=like_the_adapter
        ):
            if event.kind is EventKind.FINISHED:
                assert event.outcome is not None
                expect(event.outcome.text, ECHO)

    return one


def turn(tools: list[FunctionTool], want: str) -> Fn:
    async def one() -> None:
        call_id = next_id()
        model = ScriptedModel(
            [[function_call("noop", ARGS, call_id=call_id)], [assistant_message("done")]]
        )
        agent = Agent(name="bench", tools=tools, model=model)
        await Runner.run(agent, "go", run_config=OFFLINE)
        [output] = [
            item["output"]
            for item in model.calls[1].input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        expect(output, want)

    return one


# ------------------------------------------------------------------ langgraph


@tool
async def lc_noop(echo: str) -> str:
    """Return `echo` unchanged."""
    return echo


def one_node_graph(node: Any, want: str) -> Fn:
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    graph = builder.compile()

    async def one() -> None:
        proposal = {"name": "noop", "args": {"echo": ECHO}, "id": next_id(), "type": "tool_call"}
        state = await graph.ainvoke({"messages": [AIMessage(content="", tool_calls=[proposal])]})
        expect(state["messages"][-1].content, want)

    return one


# ------------------------------------------------------------------ the run


def added(rows: list[dict[str, dict[str, float]]], base: str, case: str) -> dict[str, Any]:
    figures = median_round(rows, base, case)
    figures["added_p99_ms"] = statistics.median(r[case]["p99"] - r[base]["p99"] for r in rows)
    return figures


async def measure(daemon: Daemon, rounds: int, per_round: int) -> dict[str, Any]:
    assert daemon.proc is not None
    pids = [os.getpid(), daemon.proc.pid]
    lc_native = ToolNode([lc_noop.model_copy(update={"name": "noop"})])
    async with AsyncClient(daemon.address) as client:
        gated = await ExecgateTools.load(client, only=["noop"])
        [gated_noop] = gated.function_tools
        node = await ExecgateToolNode.load(client, only=["noop"])
        print("openai-agents, one call's invoke: p50 ms")
        invokes = await rounds_of(
            {
                "native": invoke(noop, ECHO),
                "execgate": invoke(gated_noop, f"[success]\n{ECHO}"),
                "same_request": bare_stream(client, like_the_adapter=True),
                "outcomes_only": bare_stream(client, like_the_adapter=False),
            },
            rounds,
            per_round,
            pids,
        )
        print("openai-agents, a Runner.run turn with that call: p50 ms")
        turns = await rounds_of(
            {
                "native": turn([noop], ECHO),
                "execgate": turn(gated.function_tools, f"[success]\n{ECHO}"),
            },
            rounds,
            per_round // 2,
            pids,
        )
        print("langgraph, a one-node graph with that call: p50 ms")
        nodes = await rounds_of(
            {
                "native": one_node_graph(lc_native, ECHO),
                "execgate": one_node_graph(node, f"[success]\n{ECHO}"),
            },
            rounds,
            per_round,
            pids,
        )
    return {
        "openai_agents_invoke": {**added(invokes, "native", "execgate"), "rounds": invokes},
        "same_request": added(invokes, "native", "same_request"),
        "outcomes_only": added(invokes, "native", "outcomes_only"),
        "openai_agents_turn": {**added(turns, "native", "execgate"), "rounds": turns},
        "langgraph_node": {**added(nodes, "native", "execgate"), "rounds": nodes},
    }


def print_report(res: dict[str, Any]) -> None:
    def block(title: str, f: dict[str, Any]) -> None:
        b, c = f["base"], f["case"]
        print(f"\n== {title}")
        print(
            f"  native     p50 {b['p50']:7.3f} ms  p99 {b['p99']:7.3f} ms  others {b['others']:.2f}"
        )
        print(
            f"  execgate   p50 {c['p50']:7.3f} ms  p99 {c['p99']:7.3f} ms  others {c['others']:.2f}"
        )
        ok = "met" if f["added_ms"] <= GOAL_ADDED_P50_MS else "NOT met"
        print(
            f"  added      p50 {f['added_ms']:+7.3f} ms  p99 {f['added_p99_ms']:+7.3f} ms"
            f"  ({f['ratio']:.2f}x; goal p50 <= {GOAL_ADDED_P50_MS} ms: {ok})"
        )

    block("openai-agents: one call (FunctionTool.on_invoke_tool)", res["openai_agents_invoke"])
    inv, same, cheap = (
        res[k]["case"]["p50"] for k in ("openai_agents_invoke", "same_request", "outcomes_only")
    )
    print(
        f"  of which: the cheapest Execute (outcomes only, no key) {cheap:.3f} ms;"
        f" the adapter's request (progress events, idempotency key, batch id)"
        f" {same - cheap:+.3f} ms; the adapter's own code {inv - same:+.3f} ms"
    )
    block("openai-agents: a Runner.run turn with one call", res["openai_agents_turn"])
    block(
        "langgraph: a one-node graph, one call (ToolNode vs ExecgateToolNode)",
        res["langgraph_node"],
    )


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rounds, per_round = (2, 10) if args.quick else (5, 200)
    daemon = Daemon(tmp / "daemon")
    await asyncio.to_thread(daemon.start)
    try:
        return await measure(daemon, rounds, per_round)
    finally:
        if daemon.stop() != 0:
            raise BenchError(f"the daemon exited badly:\n{daemon.log()[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eg-bench-frameworks-") as d:
        tmp = Path(d)
        env = environment(tmp)
        print(json.dumps(env))
        try:
            res = asyncio.run(run(args, tmp))
        except BenchError as exc:
            print(f"BROKEN: {exc}", file=sys.stderr)
            return 1
    env["loadavg_at_end"] = os.getloadavg()
    print_report(res)
    print(f"\nload average: start {env['loadavg_at_start']}, end {env['loadavg_at_end']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    goals = {"added_p50_ms": GOAL_ADDED_P50_MS}
    RESULTS.write_text(json.dumps({"environment": env, "goals": goals, **res}, indent=2) + "\n")
    print(f"results: {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
