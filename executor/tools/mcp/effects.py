"""What an MCP server's tool is to the scheduler: its spec, its claims, may_write.

Who is believed, in order:

1. The operator's override for the tool (`ToolOverride`): `effects` templates over
   the call's arguments (template.py, as a command tool's) name the files and
   tables it reads and writes (confined to the workspace, canonicalised like the
   built-ins' paths, each path given whole: `declguard.path_text`) and the hosts it
   reaches; `read_only`, `destructive`, `idempotent` replace the server's hints.
2. A trusted server's annotations: `readOnlyHint` makes a reader,
   `destructiveHint` / `idempotentHint` are copied, `openWorldHint` is kept for
   `execgate tools` (the network itself is the policy's sandbox rule's to open).
3. Otherwise -- an untrusted server, or a trusted one that says nothing -- the
   tool writes: WRITE on the server's key (`mcp:NAME`), so its calls run one at
   a time, and WRITE on the workspace when the server's workspace is writable.

A reader claims READ on the server's key: readers of one server run together,
and a writer of the same server waits for them.

Unlike a command tool's, an override's template whose arguments the call leaves
out is REJECTED (not left out): the server may use its own default for an absent
argument, a path the template could not name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp.types as mcp_types

from execgate.executor.core.errors import invalid
from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Claim, Mode, workspace_key
from execgate.executor.locks.keys import server_key

from .. import template
from ..base import ToolSpec
from ..decl import EffectsDecl, ServerDecl, ToolOverride
from ..declguard import field_of, net_claim, path_text, table_claim
from ..effects import CallEffects, file_key


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


def spec_for(server: ServerDecl, tool: mcp_types.Tool, believed: Hints) -> ToolSpec:
    """The spec served. An override's effects paths are not resources of the spec: the
    call's analysis resolves them (`call_effects`), and the policy sees them there."""
    return ToolSpec(
        name=f"{server.name}.{tool.name}",
        description=tool.description or tool.title or "",
        input_schema=dict(tool.input_schema or {"type": "object"}),
        read_only=believed.read_only,
        destructive=believed.destructive,
        idempotent=believed.idempotent,
    )


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
        return _declared(server, believed, effects, dict(args), workspace)
    mine = server_key(server, workspace.lock_root)
    if believed.read_only:
        return CallEffects((Claim(mine, Mode.READ),), False)
    claims = [Claim(mine, Mode.WRITE)]
    if workspace_writable:
        claims.append(Claim(workspace_key(workspace.lock_root), Mode.WRITE))
    return CallEffects(tuple(claims), True)


def _declared(
    server: str, believed: Hints, effects: EffectsDecl, args: dict[str, Any], workspace: Workspace
) -> CallEffects:
    """An override's effects: each path resolved (the policy sees them by where they are
    declared, as a command tool's), each table and host claimed."""
    claims = [Claim(server_key(server, workspace.lock_root), Mode.READ)]
    found: dict[str, Path] = {}
    for key, mode in (("reads", Mode.READ), ("writes", Mode.WRITE)):
        for i, text in enumerate(getattr(effects, key)):
            where = f"effects.{key}[{i}]"
            path = workspace.resolve(_given(text, args, where), field_of(text, where))
            found[where] = path
            claims.append(Claim(file_key(workspace, path), mode))
    for key, mode in (("read_tables", Mode.READ), ("write_tables", Mode.WRITE)):
        for i, text in enumerate(getattr(effects, key)):
            where = f"effects.{key}[{i}]"
            claims.append(
                table_claim(_given(text, args, where), field_of(text, where), mode, workspace)
            )
    for i, host in enumerate(effects.net):
        value = template.parse(host).expand(args)
        if value is None:
            raise _absent(host, f"effects.net[{i}]")
        claim = net_claim(value, field_of(host, f"effects.net[{i}]"))
        if claim is not None:
            claims.append(claim)
    return CallEffects(tuple(claims), not believed.read_only, paths=found)


def _given(text: str, args: dict[str, Any], where: str) -> str:
    """The path template expanded (`declguard.path_text`: each argument a string or a
    number, none absolute inside it); REJECTED when the call gives none of them."""
    value = path_text(text, args, where)
    if value is None:
        raise _absent(text, where)
    return value


def _absent(text: str, where: str) -> Exception:
    name = template.parse(text).names[0]
    return invalid(f"{where} ({text!r}) needs argument {name!r}", f"arguments.{name}")
