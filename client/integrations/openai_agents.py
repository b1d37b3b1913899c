"""The daemon's tools as the OpenAI Agents SDK's function tools (`pip install
'execgate[openai-agents]'`).

    from agents import Agent, Runner
    from execgate.client import AsyncClient
    from execgate.client.integrations.openai_agents import ExecgateTools

    async with AsyncClient() as eg:
        tools = await ExecgateTools.load(eg)          # what ListTools serves
        agent = Agent(name="coder", instructions="...", tools=tools.function_tools)
        result = await Runner.run(agent, "add a test for parse()")

Each function tool's schema is the daemon's (`ListTools`); the SDK's tool-call id
(`ToolContext.tool_call_id`) is the execgate call id and, prefixed with the run id,
its idempotency key. What the model reads is the outcome rendered with its status and
error class (`[rejected: policy_denied] do not retry: ...`), so a policy denial reaches
the model as such; a call a policy `ask` rule parks is reported to `on_event` and the
log while it waits. Cancelling the SDK's run (the task awaiting `Runner.run`, or
`RunResultStreaming.cancel()`) cancels the call at the daemon (`Cancel`), which stops a
started call down its cancel ladder.

The SDK runs a turn's function calls as concurrent tasks, each invoked alone: each is
its own execgate batch. The daemon's scheduler still serializes conflicting ones (two
writes of one file never overlap, reads run together), in the order they reach it --
which is the proposal order in practice, but only one batch guarantees it (the LangGraph
node sends a turn as one).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from .._async import AsyncClient
from ..loop.observe import DEFAULT_CAP
from ._gate import EventHook, Gate, GateTool, model_names

try:
    from agents import FunctionTool
    from agents.tool_context import ToolContext
except ModuleNotFoundError as exc:
    if (exc.name or "").partition(".")[0] != "agents":
        raise
    raise ModuleNotFoundError(
        "execgate.client.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'execgate[openai-agents]'"
    ) from exc

__all__ = ["ExecgateTools"]


class ExecgateTools:
    """The daemon's tools for one agent run, as `FunctionTool`s (`function_tools`).

    Build with `await ExecgateTools.load(client)`. `run_id` is the execgate run of the
    calls (default: a new one; pass the same id to resume a run, so that re-sent
    calls are answered from the journal).
    """

    def __init__(self, gate: Gate, tools: Iterable[GateTool]) -> None:
        self.gate = gate
        self.function_tools: list[FunctionTool] = [self._function_tool(t) for t in tools]

    @classmethod
    async def load(
        cls,
        client: AsyncClient,
        *,
        run_id: str | None = None,
        only: Iterable[str] | None = None,
        on_event: EventHook | None = None,
        cap: int = DEFAULT_CAP,
    ) -> ExecgateTools:
        """The tools `ListTools` serves (those named in `only`, if given).

        Args:
            client: the connection to the daemon.
            run_id: the execgate run the calls belong to (default: a new one).
            only: execgate tool names to offer (default: all); an unknown one is a
                ValueError.
            on_event: called with each event of the calls (awaiting_approval among them).
            cap: the most characters of a result the model reads.
        """
        gate = Gate(client, run_id=run_id, on_event=on_event, cap=cap)
        return cls(gate, model_names(await client.list_tools(), only))

    @property
    def run_id(self) -> str:
        return self.gate.run_id

    async def cancel_run(self, reason: str = "") -> list[str]:
        """Stop the whole execgate run: its calls in flight, and any later call of it
        (REJECTED `cancelled`). Returns the ids of the calls reached."""
        return await self.gate.client.cancel(run_id=self.gate.run_id, reason=reason)

    def _function_tool(self, tool: GateTool) -> FunctionTool:
        return FunctionTool(
            name=tool.name,
            description=tool.spec.description,
            params_json_schema=dict(tool.spec.input_schema),
            on_invoke_tool=functools.partial(self._invoke, tool),
            # The daemon validates against its own schema; the SDK's strict mode would
            # rewrite it (every property required, no additional ones).
            strict_json_schema=False,
        )

    async def _invoke(self, tool: GateTool, ctx: ToolContext[Any], arguments: str) -> str:
        call = self.gate.call(tool.spec.name, arguments, ctx.tool_call_id)
        [outcome] = await self.gate.run([call])
        return self.gate.observe(outcome, tool.spec.name).render()
