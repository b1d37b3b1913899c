"""N concurrent increments of one file in one turn, with the OpenAI Agents SDK: run by
the SDK itself, then through execgate.

    python examples/frameworks/openai_agents_increments.py [-n 6] [--addr ADDR --workspace DIR]

One model turn proposes N `increment`s of a counter file and three `peek`s of notes.txt
(tools.yaml beside this file). The SDK runs a turn's function calls concurrently: run
by the SDK, the increments all read the counter before any writes it back, and updates
are lost. Through execgate (`ExecgateTools`: the same tools, the same turn) the daemon
knows each increment writes that file: they run one at a time and none is lost, while
the peeks, which only read, still run together. The SDK's own scripted model
(`agents.testing.ScriptedModel`) plays the model: no API key, no network.

Needs `pip install 'execgate[daemon,openai-agents]'`. Without --addr it starts a private
daemon with this folder's tools.yaml and policy.yaml; exit status 1 if execgate lost an
update, 2 if no daemon answers.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from agents import Agent, FunctionTool, RunConfig, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from common import Ran, Timeline, arguments, counter, daemon, notes, report, run_natively

from execgate.client import AsyncClient, DaemonUnavailable
from execgate.client.integrations.openai_agents import ExecgateTools


def the_turn(n: int, path: str) -> ScriptedModel:
    calls = [function_call("increment", {"path": path}, call_id=f"inc{i}") for i in range(n)]
    calls += [function_call("peek", {"path": "notes.txt"}, call_id=f"peek{i}") for i in range(3)]
    return ScriptedModel([calls, [assistant_message("done")]])


async def run(tools: list[FunctionTool], model: ScriptedModel) -> None:
    agent = Agent(name="counter", instructions="count", tools=tools, model=model)
    await Runner.run(agent, "count", run_config=RunConfig(tracing_disabled=True))


def native_tools(workspace: Path, ran: list[Ran]) -> list[FunctionTool]:
    """increment and peek as the SDK's own function tools: the same programs."""

    @function_tool
    async def increment(ctx: ToolContext[Any], path: str) -> str:
        """Add one to the integer in a file."""
        return await run_natively(workspace, ctx.tool_call_id, path, ran)

    @function_tool
    async def peek(ctx: ToolContext[Any], path: str) -> str:
        """Print a file."""
        return await run_natively(workspace, ctx.tool_call_id, path, ran)

    return [increment, peek]


async def main() -> int:
    args = arguments(__doc__ or "")
    with daemon(args) as (address, workspace):
        notes(workspace)
        ran: list[Ran] = []
        native = counter(workspace, "counter-sdk.txt")
        await run(native_tools(workspace, ran), the_turn(args.n, native.name))
        report("run by the OpenAI Agents SDK itself:", args.n, native, ran)

        gated, timeline = counter(workspace, "counter-execgate.txt"), Timeline()
        async with AsyncClient(address, token=args.token) as eg:
            tools = await ExecgateTools.load(eg, on_event=timeline)
            await run(tools.function_tools, the_turn(args.n, gated.name))
        lost = report("through execgate:", args.n, gated, timeline.ran)
    return 1 if lost else 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except DaemonUnavailable as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
