"""`McpProvider`: the declared MCP servers' tools, and the servers' lifetimes.

`start` runs every server once to list its tools (a server's tools cannot be
known without it): a `prestart` server pooled per daemon keeps that process for
its calls; the others' are closed and started again on their first call.

The workspace is bound read-only for a server whose every tool is a reader (as
the daemon believes, effects.py) and read-write otherwise. Discovery runs
read-only; a server found to have a writer is started again read-write before
its tools are served (so a writer server costs one more spawn at daemon start).

The sandbox is chosen as for a declared command: the policy's sandbox rule for the
tool name `NAME.*` (which alone may open the network) over the decl's backend and
limits, else the daemon's default; the tools file may not choose `process` where
the daemon's sandbox is stronger. `sandbox.image` is the server's docker image.
`close` kills every server's whole tree.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any

import jsonschema

from execgate.executor.core.paths import Workspace
from execgate.executor.sandbox import Confinement, Launch, Sandbox, SandboxError
from execgate.executor.sandbox.registry import Sandboxes

from ..base import Tool
from ..decl import Pool, ServerDecl
from .effects import hints
from .server import Server, ServerDown, ServerStatus
from .tool import McpTool

log = logging.getLogger("execgate.mcp")

BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


class McpProvider:
    def __init__(
        self, sandboxes: Sandboxes, workspace: Workspace, *, output_cap: int = 1 << 20
    ) -> None:
        self._sandboxes = sandboxes
        self._workspace = workspace
        self._output_cap = output_cap
        self._servers: dict[str, Server] = {}
        self._tools: dict[str, Tool] = {}
        # Server name -> its workspace is bound read-write (some tool may write).
        self._writable: dict[str, bool] = {}

    async def start(self, decls: tuple[ServerDecl, ...]) -> None:
        """List every server's tools. A server that does not start is logged and left
        out (its tools are not served; `status` names the error)."""
        for decl in decls:
            server = Server(decl, self._launcher(decl))
            self._servers[decl.name] = server
            try:
                await self._discover(server)
            except ServerDown as exc:
                log.error("%s; its tools are not served", exc)

    async def _discover(self, server: Server) -> None:
        decl = server.decl
        self._writable[decl.name] = False
        conn = await server.connection("", decl.startup_timeout)
        overrides = dict(decl.tools)
        found: list[McpTool] = []
        for listed in conn.tools:
            override = overrides.get(listed.name)
            if override is not None and override.hidden:
                continue
            refused = schema_problem(listed.input_schema)
            if refused:
                server.last_error = f"tool {listed.name} left out: {refused}"
                log.error("MCP server %s: %s", decl.name, server.last_error)
                continue
            found.append(
                McpTool(
                    server,
                    listed,
                    hints(decl, listed, override),
                    override,
                    workspace_writable=False,
                )
            )
        writer = any(not t.hints.read_only for t in found)
        keep = decl.prestart and decl.pool is Pool.DAEMON
        if writer or not keep:
            await server.close()
        if writer:
            self._writable[decl.name] = True
            for mine in found:
                mine.workspace_writable = True
            if keep:
                await server.connection("", decl.startup_timeout)
        for mine in found:
            self._tools[mine.spec.name] = mine

    def _launcher(self, decl: ServerDecl) -> Any:
        async def launch(key: str) -> tuple[Sandbox, Launch]:
            agent = key.removeprefix("agent:") if key.startswith("agent:") else "local"
            sandbox, conf = self._sandbox_for(decl, agent)
            cwd = self._workspace.resolve(decl.cwd, f"servers.{decl.name}.cwd")
            root = self._workspace.root
            return sandbox, Launch(
                argv=(decl.command, *decl.args),
                cwd=cwd,
                env=_env(decl, str(root)),
                stdin=None,
                workspace=root,
                writable=self._writable.get(decl.name, False),
                marker=secrets.token_hex(8),
                confinement=conf,
                output_cap=self._output_cap,
                serve=True,
                image=decl.sandbox.image,
            )

        return launch

    def _sandbox_for(self, decl: ServerDecl, agent: str) -> tuple[Sandbox, Confinement]:
        """As for a declared command (`Sandboxes.for_call`): the policy's rule for `NAME.*`
        over the file's backend and limits. A server that names an image runs in docker
        or not at all (its command is a path in that image, not on this host)."""
        box = decl.sandbox
        sandbox, conf = self._sandboxes.for_call(
            f"{decl.name}.*", agent, placed=(box.backend, box.limits)
        )
        if box.image and sandbox.name != "docker":
            raise SandboxError(
                f"the server names image {box.image}, but runs under {sandbox.name} "
                "(the policy's sandbox rule for it chose that backend)"
            )
        return sandbox, conf

    def tools(self) -> dict[str, Tool]:
        return dict(self._tools)

    def status(self) -> list[ServerStatus]:
        return [s.status() for s in self._servers.values()]

    async def close(self) -> None:
        """Kill every server (its whole tree); nothing of them is left."""
        for server in self._servers.values():
            await server.close()


def schema_problem(schema: Any) -> str:
    """Why a server's inputSchema cannot be used to validate calls ("" if it can): the
    daemon validates every call against it before the server sees it."""
    if not isinstance(schema, dict):
        return "its inputSchema is not an object"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"its inputSchema is not a valid JSON Schema: {exc.message}"
    return ""


def _env(decl: ServerDecl, home: str) -> dict[str, str]:
    env = {**BASE_ENV, "HOME": home}
    env.update(dict(decl.env.set))
    for name in decl.env.passthrough:
        if name in os.environ:
            env[name] = os.environ[name]
    for child, daemon in decl.env.secrets:
        if daemon in os.environ:
            env[child] = os.environ[daemon]
    return env
