"""An MCP `CallToolResult` as a `ToolOutput`.

Text content becomes the result's text (items joined by newlines); other
content kinds (images, audio, resources) are listed in `structured.content` by
kind and size, never inlined; `structuredContent` becomes the structured result.
`isError` is FAILURE/tool_error with the server's text as the message. The
pipeline bounds the text (PARTIAL when cut) and keeps the whole in the journal.
"""

from __future__ import annotations

from typing import Any

import mcp.types as mcp_types

from execgate.executor.core.outcomes import ErrorClass, Evidence

from ..base import ToolOutput

# Characters of an isError text used as the outcome's message (the text stays whole).
MESSAGE_CHARS = 500


def to_output(result: mcp_types.CallToolResult, where: str) -> ToolOutput:
    texts: list[str] = []
    others: list[dict[str, Any]] = []
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            texts.append(item.text)
        else:
            others.append(_describe(item))
    text = "\n".join(texts)
    structured: dict[str, Any] = {}
    if result.structured_content is not None:
        structured = dict(result.structured_content)
    if others:
        structured = {**structured, "content": others}
    failed = bool(result.is_error)
    return ToolOutput(
        text=text,
        structured=structured,
        evidence=Evidence(sandbox=where),
        error_class=ErrorClass.TOOL_ERROR if failed else ErrorClass.NONE,
        message=(text[:MESSAGE_CHARS] or "the tool reported an error") if failed else "",
    )


def _describe(item: Any) -> dict[str, Any]:
    kind = getattr(item, "type", type(item).__name__)
    described: dict[str, Any] = {"type": kind}
    data = getattr(item, "data", None)
    if isinstance(data, str):
        described["bytes_base64"] = len(data)
    for name in ("mime_type", "uri", "name"):
        value = getattr(item, name, None) or getattr(getattr(item, "resource", None), name, None)
        if isinstance(value, str):
            described[name] = value
    return described
