"""`McpTool`: one tool of an MCP server, as an execgate `Tool`.

Validation checks the arguments against the server's inputSchema (the spec's
`input_schema`) and asks `call_effects` for the claims (effects.py); `run` takes
the server's process for the call's pool key (started now if needed), sends
`tools/call` with the call's trace context in `_meta` (tracecontext.py), and maps
the answer (results.py) or the stop (calling.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mcp.types as mcp_types

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass
from execgate.executor.core.paths import Workspace

from ..base import ToolContext, ToolOutput
from ..decl import ToolOverride
from ..effects import CallEffects
from . import tracecontext
from .calling import Call, call
from .effects import Hints, call_effects, spec_for
from .server import Server, ServerDown


class McpTool:
    def __init__(
        self,
        server: Server,
        tool: mcp_types.Tool,
        believed: Hints,
        override: ToolOverride | None,
        *,
        workspace_writable: bool,
    ) -> None:
        self.server = server
        self.remote_name = tool.name
        self.provider = f"mcp:{server.decl.name}"  # ListTools' provider column
        self.hints = believed
        # ListTools' annotations_trusted: the effects are the operator's or a trusted
        # server's, not the untrusted default (a writer).
        self.annotations_trusted = believed.source != "untrusted"
        self._effects = override.effects if override is not None else None
        self.spec = spec_for(server.decl, tool, believed, self._effects)
        # Set by the provider once it knows whether some tool of the server writes.
        self.workspace_writable = workspace_writable

    def call_effects(
        self, args: dict[str, Any], paths: Mapping[str, Path], workspace: Workspace
    ) -> CallEffects:
        del paths  # the templates name their own arguments
        return call_effects(
            self.server.decl.name,
            self.hints,
            self._effects,
            args,
            workspace,
            workspace_writable=self.workspace_writable,
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        server = self.server
        key = server.key_for(ctx.run_id, ctx.agent)
        try:
            conn = await server.connection(key, ctx.remaining())
        except ServerDown as exc:
            raise ToolError(ErrorClass.SANDBOX_ERROR, str(exc)) from exc
        where = conn.running.description
        what = Call(server.decl.name, self.remote_name, where, tracecontext.for_call(ctx))
        server.enter(key)
        try:
            return await call(conn, what, args, ctx, server.force_restart)
        finally:
            server.leave(key)
