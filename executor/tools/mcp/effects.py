"""What an MCP server's tool is to the scheduler: its spec, its claims, may_write.

Who is believed, in order:

1. The operator's override for the tool (`ToolOverride`): `effects` templates over
   the call's arguments name the files it reads and writes (confined to the
   workspace, canonicalised like the built-ins' paths); `read_only`,
   `destructive`, `idempotent` replace the server's hints.
2. A trusted server's annotations: `readOnlyHint` makes a reader,
   `destructiveHint` / `idempotentHint` are copied, `openWorldHint` is kept for
   `execgate tools` (the network itself is the policy's sandbox rule's to open).
3. Otherwise -- an untrusted server, or a trusted one that says nothing -- the
   tool writes: WRITE on the server's key (`mcp:NAME`), so its calls run one at
   a time, and WRITE on the workspace when the server's workspace is writable.

A reader claims READ on the server's key: readers of one server run together,
and a writer of the same server waits for them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp.types as mcp_types

from execgate.executor.core.errors import invalid
from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Claim, Mode, net_key, workspace_key
from execgate.executor.locks.keys import server_key

from ..base import ResourceKind, ResourceTemplate, ToolSpec
from ..decl import EffectsDecl, ServerDecl, ToolOverride
from ..effects import CallEffects, file_key

_WHOLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Hints:
    """What the daemon believes of one tool, and why (for `execgate tools`)."""

    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool
    # "override", "annotations" (a trusted server's) or "untrusted" / "unannotated".
    source: str


def hints(server: ServerDecl, tool: mcp_types.Tool, override: ToolOverride | None) -> Hints:
    notes = tool.annotations if server.trusted else None
    source = (
        "annotations"
        if notes is not None
        else ("untrusted" if not server.trusted else "unannotated")
    )
    read_only = bool(notes and notes.read_only_hint)
    # MCP's defaults: a tool that is not read-only is destructive unless it says not.
    destructive = not read_only and (notes is None or notes.destructive_hint is not False)
    idempotent = bool(notes and notes.idempotent_hint)
    open_world = notes is None or notes.open_world_hint is not False
    if override is not None:
        if override.effects is not None and override.effects.declared:
            read_only, source = not override.effects.may_write, "override"
        if override.read_only is not None:
            read_only, source = override.read_only, "override"
        if override.destructive is not None:
            destructive = override.destructive
        if override.idempotent is not None:
            idempotent = override.idempotent
    return Hints(
        read_only=read_only,
        destructive=destructive and not read_only,
        idempotent=idempotent,
        open_world=open_world,
        source=source,
    )


def spec_for(
    server: ServerDecl, tool: mcp_types.Tool, believed: Hints, effects: EffectsDecl | None
) -> ToolSpec:
    """The spec served. Effects templates that are one whole argument (`{path}`) are
    also its resources: validation resolves them (an escape is REJECTED) and the policy
    sees them as the call's paths, as it sees a built-in's."""
    return ToolSpec(
        name=f"{server.name}.{tool.name}",
        description=tool.description or tool.title or "",
        input_schema=dict(tool.input_schema or {"type": "object"}),
        read_only=believed.read_only,
        destructive=believed.destructive,
        idempotent=believed.idempotent,
        resources=_resources(effects),
    )


def _resources(effects: EffectsDecl | None) -> tuple[ResourceTemplate, ...]:
    if effects is None or not effects.declared:
        return ()
    found = []
    for templates, mode in ((effects.reads, Mode.READ), (effects.writes, Mode.WRITE)):
        for template in templates:
            whole = _WHOLE.fullmatch(template)
            if whole is not None:
                found.append(ResourceTemplate(ResourceKind.FILE, whole.group(1), mode))
    return tuple(found)


def call_effects(
    server: str,
    believed: Hints,
    effects: EffectsDecl | None,
    args: Mapping[str, Any],
    workspace: Workspace,
    *,
    workspace_writable: bool,
) -> CallEffects:
    """The claims of one call (see the module's docstring)."""
    if effects is not None and effects.declared:
        claims = [Claim(server_key(server), Mode.READ)]
        claims += _paths(effects.reads, Mode.READ, args, workspace)
        claims += _paths(effects.writes, Mode.WRITE, args, workspace)
        claims += [Claim(net_key(render(h, args)), Mode.READ) for h in effects.net]
        return CallEffects(tuple(claims), not believed.read_only)
    if believed.read_only:
        return CallEffects((Claim(server_key(server), Mode.READ),), False)
    claims = [Claim(server_key(server), Mode.WRITE)]
    if workspace_writable:
        claims.append(Claim(workspace_key(), Mode.WRITE))
    return CallEffects(tuple(claims), True)


def _paths(
    templates: tuple[str, ...], mode: Mode, args: Mapping[str, Any], workspace: Workspace
) -> list[Claim]:
    claims = []
    for template in templates:
        field = f"arguments.{_first_argument(template) or 'effects'}"
        path: Path = workspace.resolve(render(template, args), field)
        claims.append(Claim(file_key(workspace, path), mode))
    return claims


def render(template: str, args: Mapping[str, Any]) -> str:
    """`{name}` replaced by the argument `name` (a string or number); `{{`/`}}` literal."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) in ("{{", "}}"):
            return match.group(0)[0]
        name = match.group(1)
        value = args.get(name)
        if value is None:
            raise invalid(f"the effects template needs argument {name!r}", f"arguments.{name}")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise invalid(f"argument {name!r} must be a string to name a path", f"arguments.{name}")
        return str(value)

    return _PLACEHOLDER.sub(one, template)


def _first_argument(template: str) -> str | None:
    found = _PLACEHOLDER.search(template.replace("{{", "").replace("}}", ""))
    return found.group(1) if found else None
