"""A result's structuredContent checked against its tool's outputSchema, within bounds.

The SDK's `ClientSession.call_tool` checks a result against the tool's outputSchema
itself, with jsonschema: `re` for its patterns, on the event loop. Both the schema and
the result are the server's, so a server could hold the whole daemon as long as it
liked (`^(a|aa)*$` against its own `"aaa...b"`), whatever the agent sent. And for a
tool it has not listed, the SDK lists the server's tools again.

`CheckedSession` is the SDK's session with that check replaced: the schemas are the
ones the daemon listed (and accepted, provider.schema_problem) at start, validated
like a served tool's arguments (`BoundedValidator`: patterns under a time budget, off
the event loop; references never fetched). A result that does not fit, or whose check
runs out of time, raises `OutputMismatch` (the call's FAILURE/tool_error: the server
answered, its answer is wrong).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import mcp.types as mcp_types
from jsonschema.exceptions import best_match
from mcp import ClientSession

from execgate.executor.core.errors import ExecgateError

from .. import schemabound
from ..schemabound import NO_RETRIEVAL, has_patterns
from ..toolset import BoundedValidator


class OutputMismatch(ExecgateError):
    """A result's structuredContent does not fit its tool's outputSchema (or the check
    ran out of time)."""


class CheckedSession(ClientSession):
    """`ClientSession`, its result check bounded (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Tool name -> (its outputSchema's validator, whether it holds patterns); set
        # once the tools are listed. A tool not in it has nothing to check.
        self.outputs: Mapping[str, tuple[Any, bool]] = {}

    def know(self, tools: list[mcp_types.Tool]) -> None:
        """The listed tools' outputSchemas, for the results of their calls."""
        self.outputs = {
            t.name: (
                BoundedValidator(t.output_schema, registry=NO_RETRIEVAL),
                has_patterns(t.output_schema),
            )
            for t in tools
            if t.output_schema is not None
        }

    async def validate_tool_result(self, name: str, result: mcp_types.CallToolResult) -> None:
        known = self.outputs.get(name)
        if known is None:
            return
        validator, patterned = known
        value = result.structured_content
        if value is None:
            raise OutputMismatch(f"tool {name} has an outputSchema but gave no structuredContent")
        if patterned:  # its patterns may take their budget: not on the event loop
            size = len(json.dumps(value))
            await asyncio.to_thread(_check, validator, value, size)
        else:
            _check(validator, value, 0)


def _check(validator: Any, value: dict[str, Any], size: int) -> None:
    try:
        with schemabound.budget(size):
            error = best_match(validator.iter_errors(value))
    except RecursionError as exc:
        raise OutputMismatch("its structuredContent is nested too deeply to check") from exc
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path)
        raise OutputMismatch(
            f"its structuredContent{where} does not fit its outputSchema: {error.message[:300]}"
        )
