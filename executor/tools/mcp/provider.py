"""`McpProvider`: the declared MCP servers' tools, and the servers' lifetimes.

`start` runs every server once to list its tools (a server's tools cannot be
known without it): a `prestart` server pooled per daemon keeps that process for
its calls; the others' are closed and started again on their first call.

The workspace is bound read-only for a server whose every tool is a reader (as
the daemon believes, effects.py) and read-write otherwise. Discovery runs
read-only; a server found to have a writer is started again read-write before
its tools are served (so a writer server costs one more spawn at daemon start).

Where a process runs (`Placement`) is where the policy puts the call that uses
it: the backend and confinement of the sandbox rule covering that call's tool
and agent, over the server's `sandbox:` (as for a declared command:
`Sandboxes.for_call`). Agents with different rules (one with the network, one
without) get different processes; discovery's process is agent `local`'s for
`NAME.*`. After an identities reload (an agent's groups may pick another rule)
`reconfine` closes the processes no caller of theirs would be given now.

A process serves one workspace: its cwd (`cwd:` resolved there) and its only bind are
the workspace of the calls it serves, which is part of its pool key, so calls in
different workspaces never share one (nor its lock key: effects.py). Discovery's
process, and a prestarted one, are the daemon's --workspace's.
The tools file may not choose `process` where the daemon's sandbox is stronger;
`sandbox.image` is the server's docker image (it then runs in docker or not at all).
`run_ended` closes a run's processes (`pool: run`); `close` kills every
server's whole tree.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Callable
from typing import Any

import jsonschema
import mcp.types as mcp_types

from execgate.executor.core.paths import Workspace
from execgate.executor.sandbox import Launch, SandboxError
from execgate.executor.sandbox.registry import Sandboxes

from ..base import Tool
from ..decl import Pool, ServerDecl, ToolOverride
from ..schemabound import outside_ref, pattern_problem
from ..toolparts import EFFECT_KINDS, effect_problem
from .effects import hints
from .server import Placement, Placer, PoolKey, Server, ServerDown, ServerStatus
from .tool import McpTool

log = logging.getLogger("execgate.mcp")

# Discovery lists a server's tools as this agent: its process is that agent's.
DISCOVERY_AGENT = "local"
# MCP's rule for a tool's name (SEP-986, spec 2025-11-25). A name outside it is not
# served: a `/` would put it beyond a policy glob's `*` (`deny: [NAME.*]`), control
# characters would reach the log and the operator's terminal.
TOOL_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
# Characters of a refused name quoted in the server's last error and the log.
NAME_SHOWN = 40
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


class McpProvider:
    def __init__(
        self,
        sandboxes: Sandboxes,
        workspace: Workspace,
        *,
        output_cap: int = 1 << 20,
        memberships: Callable[[str], frozenset[str]] = lambda _agent: frozenset(),
    ) -> None:
        self._sandboxes = sandboxes
        self._workspace = workspace
        self._output_cap = output_cap
        # An agent's groups and roles now (the identities in force), for its sandbox rule.
        self._memberships = memberships
        self._servers: dict[str, Server] = {}
        self._tools: dict[str, Tool] = {}
        # Server name -> its workspace is bound read-write (some tool may write).
        self._writable: dict[str, bool] = {}

    async def start(self, decls: tuple[ServerDecl, ...]) -> None:
        """List every server's tools. A server that does not start is logged and left
        out (its tools are not served; `status` names the error)."""
        for decl in decls:
            server = Server(decl, self._launcher(decl), self._placer(decl))
            self._servers[decl.name] = server
            try:
                await self._discover(server)
            except (ServerDown, SandboxError) as exc:
                server.last_error = server.last_error or str(exc)
                log.error("%s; its tools are not served", exc)

    async def _discover(self, server: Server) -> None:
        decl = server.decl
        self._writable[decl.name] = False
        user = (f"{decl.name}.*", DISCOVERY_AGENT)
        key = PoolKey("", server.place(*user), self._workspace)
        found = await self._listed(server, key, user)
        writer = any(not t.hints.read_only for t in found)
        keep = decl.prestart and decl.pool is Pool.DAEMON
        if writer or not keep:
            await server.close()
        if writer:
            self._writable[decl.name] = True
            for mine in found:
                mine.workspace_writable = True
            if keep:
                async with server.use(key, None, user=user):
                    pass
        for mine in found:
            self._tools[mine.spec.name] = mine

    async def _listed(self, server: Server, key: PoolKey, user: tuple[str, str]) -> list[McpTool]:
        """The server's tools, as listed by a process started for `key` (kept running)."""
        async with server.use(key, None, user=user) as up:
            listed_tools = up.tools if up is not None else []
        return _served(server, listed_tools)

    def _launcher(self, decl: ServerDecl) -> Callable[[Placement, Workspace], Launch]:
        def launch(placement: Placement, workspace: Workspace) -> Launch:
            cwd = workspace.resolve(decl.cwd, f"servers.{decl.name}.cwd")
            root = workspace.root
            return Launch(
                argv=(decl.command, *decl.args),
                cwd=cwd,
                env=_env(decl, str(root)),
                stdin=None,
                workspace=root,
                writable=self._writable.get(decl.name, False),
                marker=secrets.token_hex(8),
                confinement=placement.confinement,
                output_cap=self._output_cap,
                serve=True,
                image=decl.sandbox.image,
            )

        return launch

    def _placer(self, decl: ServerDecl) -> Placer:
        """Where the policy in force puts an agent's calls of a tool of `decl`: the
        pipeline's own choice for a call (`Sandboxes.for_call` with the server's
        `sandbox:` as the declaration); SandboxError if it refuses. A server that names
        an image runs in docker or not at all (its command is a path in that image)."""
        box = decl.sandbox
        declared = (box.backend, box.limits)

        def place(tool: str, agent: str) -> Placement:
            sandbox, conf = self._sandboxes.for_call(
                tool, agent, self._memberships(agent), declared
            )
            if box.image and sandbox.name != "docker":
                raise SandboxError(
                    f"the server names image {box.image}, but runs under {sandbox.name} "
                    "(the policy's sandbox rule for it chose that backend)"
                )
            return Placement(sandbox, conf)

        return place

    def tools(self) -> dict[str, Tool]:
        return dict(self._tools)

    def status(self) -> list[ServerStatus]:
        return [s.status() for s in self._servers.values()]

    def run_ended(self, run_id: str) -> None:
        """A run reached a terminal state (the runs room's hook): its servers' processes
        (`pool: run`) close now, or as soon as their last call ends."""
        for server in self._servers.values():
            server.run_ended(run_id)

    def reconfine(self) -> None:
        """The identities changed (an agent's groups pick its sandbox rule): close the
        processes none of their callers would be given now."""
        for server in self._servers.values():
            server.reconfine()

    async def close(self) -> None:
        """Kill every server (its whole tree); nothing of them is left."""
        for server in self._servers.values():
            await server.close()


def _served(server: Server, listed: list[mcp_types.Tool]) -> list[McpTool]:
    """The listed tools to serve: those not hidden whose schema and override the daemon
    can use. One it cannot is left out, logged and named in the server's last_error."""
    decl = server.decl
    overrides = dict(decl.tools)
    found = []
    for tool in listed:
        override = overrides.get(tool.name)
        if override is not None and override.hidden:
            continue
        refused = (
            name_problem(tool.name)
            or schema_problem(tool.input_schema)
            or (schema_problem(tool.output_schema, "outputSchema") if tool.output_schema else "")
            or override_problem(tool.name, override, tool.input_schema)
        )
        if refused:
            server.last_error = f"tool {shown(tool.name)} left out: {refused}"
            log.error("MCP server %s: %s", decl.name, server.last_error)
            continue
        believed = hints(decl, tool, override)
        found.append(McpTool(server, tool, believed, override, workspace_writable=False))
    return found


def name_problem(name: str) -> str:
    """Why a listed tool's name cannot be served ("" if it can)."""
    if TOOL_NAME.fullmatch(name):
        return ""
    return f"its name is not {TOOL_NAME.pattern} (MCP's rule for tool names)"


def shown(name: str) -> str:
    """A server's tool name as the log and last_error quote it: as it is when it keeps
    to the rule, else escaped and cut short."""
    if TOOL_NAME.fullmatch(name):
        return name
    return repr(name if len(name) <= NAME_SHOWN else name[:NAME_SHOWN] + "...")


def schema_problem(schema: Any, which: str = "inputSchema") -> str:
    """Why a server's inputSchema (or outputSchema) cannot be used to validate calls (or
    their results) ("" if it can): the daemon validates every call against it before
    the server sees it, and every result against the other (outputs.py)."""
    if not isinstance(schema, dict):
        return f"its {which} is not an object"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"its {which} is not a valid JSON Schema: {exc.message}"
    except RecursionError:  # the check recurses per level; a server chooses the depth
        return f"its {which} is nested too deeply to be checked"
    ref = outside_ref(schema)
    if ref is not None:
        return f"its {which} refers to {ref!r}: only references inside it (#...) are followed"
    unbounded = pattern_problem(schema)
    return f"its {which}'s {unbounded}" if unbounded else ""


def override_problem(tool: str, override: ToolOverride | None, schema: dict[str, Any]) -> str:
    """Why the override's effects do not fit the tool's inputSchema ("" if they do),
    named at the override's file:line: a template checked like a command tool's at
    load (`toolparts.effect_problem`), against the properties the server declares."""
    effects = override.effects if override is not None else None
    if override is None or effects is None:
        return ""
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    for key in EFFECT_KINDS:
        for i, text in enumerate(getattr(effects, key)):
            problem = effect_problem(key, text, props, "the tool's inputSchema")
            if problem:
                at = override.at
                return f"{at.source}:{at.line}: tools.{tool}.effects.{key}[{i}]: {problem}"
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
