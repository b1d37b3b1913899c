"""The daemon's tools as MCP tools: name, description, input schema, and annotations
derived from the effects the daemon schedules them by.

What each hint says, and why (MCP defaults in brackets: readOnly false, destructive true,
idempotent false):

- `readOnlyHint: true` exactly when the daemon takes the tool for a reader (a built-in
  reader, a command declared read-only, an MCP tool a trusted server or the operator says
  is read-only). Clients that run read-only tools in parallel may do so: the daemon runs
  readers of one resource together anyway. The other two hints mean nothing for a reader
  (the spec says so) and are left out.
- A writer whose effects the daemon believes: `readOnlyHint: false` with its
  `destructiveHint` and `idempotentHint`.
- A tool of an untrusted MCP server (`annotations_trusted` false): whatever the server
  claimed, the daemon schedules it as a writer; nothing is known of it beyond that, so
  only `readOnlyHint: false` is said and the spec's cautious defaults apply.

Every tool also carries `_meta["execgate/provider"]` (`builtin`, `command`, `mcp:NAME`)
and `_meta["execgate/annotationsTrusted"]`.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from ..types import ToolSpec

__all__ = ["hints", "mcp_tool"]


def mcp_tool(spec: ToolSpec) -> types.Tool:
    return types.Tool(
        name=spec.name,
        description=spec.description,
        input_schema=_object_schema(spec.input_schema),
        annotations=hints(spec),
        _meta={
            "execgate/provider": spec.provider,
            "execgate/annotationsTrusted": spec.annotations_trusted,
        },
    )


def hints(spec: ToolSpec) -> types.ToolAnnotations:
    if spec.read_only:
        return types.ToolAnnotations(read_only_hint=True)
    if not spec.annotations_trusted:
        return types.ToolAnnotations(read_only_hint=False)
    return types.ToolAnnotations(
        read_only_hint=False,
        destructive_hint=spec.destructive,
        idempotent_hint=spec.idempotent,
    )


def _object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """MCP requires `type: object` at the root; every tool's arguments are an object
    (the daemon refuses anything else), so a schema that does not say so still means it."""
    return schema if "type" in schema else {"type": "object", **schema}
