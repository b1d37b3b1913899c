"""`McpTool`: one tool of an MCP server, as an execgate `Tool`.

Validation checks the arguments against the server's inputSchema (the spec's
`input_schema`) and asks `call_effects` for the claims (effects.py); `run` takes
the server's process for the call's pool key (started now if needed) -- the key
names the sandbox and confinement the pipeline chose for this call
(`ctx.sandbox`, `ctx.confinement`), so the process is confined as the policy
confines this agent's call -- sends `tools/call` with the call's trace context in
`_meta` (tracecontext.py), and maps the answer (results.py) or the stop (calling.py).

`placement` is the server's `sandbox:` (backend, limits, `timeout_s`): like a
declared command's, its timeout is the call's default and ceiling.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mcp.types as mcp_types

from execgate.executor.core import clock
from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass
from execgate.executor.core.paths import Workspace
from execgate.executor.sandbox import SandboxError

from ..base import ToolContext, ToolOutput
from ..decl import SandboxDecl, ToolOverride
from ..effects import CallEffects
from . import tracecontext
from .calling import Call, call, not_sent
from .effects import Hints, call_effects, spec_for
from .server import Placement, Server, ServerDown


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
        self.spec = spec_for(server.decl, tool, believed)
        # Set by the provider once it knows whether some tool of the server writes.
        self.workspace_writable = workspace_writable
        # A PlacedTool: where its calls run, and their default and ceiling timeout.
        self.placement: SandboxDecl = server.decl.sandbox

    # Its analysis reads only its hints and resolves declared paths: validation runs
    # it on the event loop (a thread hop costs more than the analysis).
    quick_analysis = True

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
        agent = ctx.agent or "local"
        try:
            key = server.key_for(ctx.run_id, agent, self._placed(ctx, agent), ctx.workspace)
        except SandboxError as exc:
            raise ToolError(ErrorClass.SANDBOX_ERROR, str(exc)) from exc
        started, limit = clock.now(), ctx.remaining()
        user = (self.spec.name, agent)
        try:
            async with server.use(key, limit, ctx.cancel.requested, user) as conn:
                if conn is None:  # the call gave up while the server was starting
                    return not_sent(server.decl.name, ctx, started, limit)
                where = conn.running.description
                what = Call(server.decl.name, self.remote_name, where, tracecontext.for_call(ctx))
                return await call(conn, what, args, ctx, server.force_restart)
        except ServerDown as exc:
            raise ToolError(ErrorClass.SANDBOX_ERROR, str(exc)) from exc

    def _placed(self, ctx: ToolContext, agent: str) -> Placement:
        """Where the pipeline runs this call; a caller without one (the provider's own
        tests) gets what the policy gives the agent."""
        if ctx.sandbox is not None:
            return Placement(ctx.sandbox, ctx.confinement)
        return self.server.place(self.spec.name, agent)
