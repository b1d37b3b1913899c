"""The daemon's MCP servers: started after the sandboxes' leftovers are cleaned,
their tools added to the dispatcher before anything is served, killed at exit.

UNFINISHED (for the lead): the servers come from `ServeConfig.mcp_servers`. Until
the tools-file loader (`tools/toolfile.py`) is wired in, the only way to fill it is
the test-only `--mcp-servers-json FILE` (needs `--test-tools`): a JSON list of
objects with ServerDecl's fields (`tools`: name -> ToolOverride fields, `effects`
with EffectsDecl's). The loader's `ToolFile.servers` replaces it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from execgate.executor.pipeline.dispatch import Dispatcher
from execgate.executor.tools.decl import EffectsDecl, EnvDecl, Pool, ServerDecl, ToolOverride
from execgate.executor.tools.mcp import McpProvider

from .config import ServeConfig


async def start_provider(config: ServeConfig, dispatcher: Dispatcher) -> McpProvider:
    provider = McpProvider(
        dispatcher.sandboxes, dispatcher.workspace, output_cap=config.limits.raw_cap_bytes
    )
    await provider.start(config.mcp_servers)
    dispatcher.add_tools(provider.tools())
    return provider


def decls_from_json(path: Path) -> tuple[ServerDecl, ...]:
    """Test-only: ServerDecls from a JSON list (see the module docstring)."""
    items: list[dict[str, Any]] = json.loads(path.read_text())
    return tuple(_decl(item) for item in items)


def _decl(item: dict[str, Any]) -> ServerDecl:
    tools = tuple((name, _override(o)) for name, o in item.pop("tools", {}).items())
    env = EnvDecl(**{k: tuple(map(_tuple, v)) for k, v in item.pop("env", {}).items()})
    pool = Pool(item.pop("pool", "daemon"))
    args = tuple(item.pop("args", ()))
    return ServerDecl(tools=tools, env=env, pool=pool, args=args, **item)


def _override(item: dict[str, Any]) -> ToolOverride:
    effects = item.pop("effects", None)
    if effects is not None:
        fields = {k: tuple(v) for k, v in effects.items()}
        item["effects"] = EffectsDecl(declared=True, **fields)
    return ToolOverride(**item)


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
