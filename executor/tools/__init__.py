"""The built-in tools and the registry the daemon serves them from."""

from __future__ import annotations

from execgate.executor.locks import Mode
from execgate.executor.sandbox.ladder import CancelScope

from .base import Limits, ResourceKind, ResourceTemplate, Tool, ToolContext, ToolOutput, ToolSpec
from .command import RunCommand
from .files import EditFile, ListDir, ReadFile, WriteFile
from .probes import Fault, Noop, Work
from .search import Search
from .sql import Sql

__all__ = [
    "CancelScope",
    "Limits",
    "Mode",
    "ResourceKind",
    "ResourceTemplate",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "ToolSpec",
    "builtin_tools",
]


def builtin_tools(*, test_tools: bool = False) -> dict[str, Tool]:
    tools: list[Tool] = [
        ReadFile(),
        WriteFile(),
        EditFile(),
        ListDir(),
        Search(),
        RunCommand(),
        Sql(),
    ]
    if test_tools:
        tools += [Noop(), Work(), Fault()]
    return {tool.spec.name: tool for tool in tools}
