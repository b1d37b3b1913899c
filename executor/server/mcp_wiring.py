"""The daemon's MCP servers: the tools file's `servers:`, started after the sandboxes'
leftovers are cleaned, their tools in the tool set before anything is served, killed
at exit. `serve` tells the provider what changes where its processes belong: a run's
end (`McpProvider.run_ended`, from the runs room's `RunStore.on_ended`: a `pool: run`
process closes) and an identities reload (`McpProvider.reconfine`: an agent's groups
may pick another sandbox rule).

Servers are started with the daemon, not on a reload: a reload whose `servers:`
section differs from the one the daemon started with is refused (journaled, the
last good set stays) and says to restart. Its command tools may change freely.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from execgate.executor.core.errors import ConfigError
from execgate.executor.pipeline.dispatch import Dispatcher
from execgate.executor.tools import Tool
from execgate.executor.tools.decl import ServerDecl, ToolFile
from execgate.executor.tools.mcp import McpProvider
from execgate.executor.tools.toolset import ToolProvider, ToolSet


@dataclass(frozen=True, slots=True)
class ServedServers:
    """The running servers' tools as a tool-set provider (each tool is labelled
    `mcp:SERVER` by its own `provider`)."""

    provider: McpProvider
    servers: tuple[ServerDecl, ...]
    name: str = "mcp"

    def tools(self) -> Sequence[Tool]:
        return list(self.provider.tools().values())

    def contribute(self, file: ToolFile) -> Sequence[ToolProvider]:
        """For a reload of the tools file: these servers, if the file still declares
        exactly them; a ConfigError (the reload is refused) if it does not."""
        if file.servers != self.servers:
            raise ConfigError(
                "the tools file's servers: changed; MCP servers start with the daemon: "
                "restart it to apply (the tools in force stay)"
            )
        return (self,)


async def start_servers(
    dispatcher: Dispatcher, declared: ToolFile, builtins: Iterable[Tool]
) -> ServedServers:
    """Start every declared server, list its tools and put them in the tool set."""
    provider = McpProvider(
        dispatcher.sandboxes,
        dispatcher.workspace,
        output_cap=dispatcher.limits.raw_cap_bytes,
        # The identities in force at each look (a reload replaces the authorizer's).
        memberships=lambda agent: dispatcher.authorizer.memberships(agent),
    )
    await provider.start(declared.servers)
    served = ServedServers(provider, declared.servers)
    dispatcher.toolset = ToolSet.declared(builtins, declared, (served,))
    return served
