"""The built-in tools and the registry the daemon serves them from."""

from __future__ import annotations

from typing import Any

from .base import (
    CancelScope,
    Limits,
    Mode,
    ResourceKind,
    ResourceTemplate,
    Tool,
    ToolContext,
    ToolOutput,
    ToolSpec,
    schema,
)
from .command import RunCommand
from .files import EditFile, ListDir, ReadFile, WriteFile
from .search import Search

__all__ = [
    "CancelScope",
    "Limits",
    "Mode",
    "Noop",
    "ResourceKind",
    "ResourceTemplate",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "ToolSpec",
    "builtin_tools",
]


class Noop:
    """Does nothing and says so. Opt-in (`--test-tools`): for benchmarks and probes."""

    spec = ToolSpec(
        name="noop",
        description="Return `echo` unchanged; touches nothing.",
        input_schema=schema({"echo": {"type": "string"}}, []),
        read_only=True,
        idempotent=True,
    )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(text=args.get("echo", ""))


def builtin_tools(*, test_tools: bool = False) -> dict[str, Tool]:
    tools: list[Tool] = [ReadFile(), WriteFile(), EditFile(), ListDir(), Search(), RunCommand()]
    if test_tools:
        tools.append(Noop())
    return {tool.spec.name: tool for tool in tools}
