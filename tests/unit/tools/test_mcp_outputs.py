"""outputs.CheckedSession: a result checked against the outputSchema listed at start."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import mcp.types as mcp_types
import pytest

from execgate.executor.tools.mcp.outputs import CheckedSession, OutputMismatch

OUT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
BACKTRACKS = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|aa)*$"}}}


def _session(**schemas: dict[str, Any]) -> CheckedSession:
    # Only the check is under test: no streams, no dispatcher.
    session = object.__new__(CheckedSession)
    tools = [
        mcp_types.Tool(name=n, input_schema={"type": "object"}, output_schema=s)
        for n, s in schemas.items()
    ]
    session.know([*tools, mcp_types.Tool(name="plain", input_schema={"type": "object"})])
    return session


def _result(structured: dict[str, Any] | None) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(content=[], structured_content=structured)


def _check(session: CheckedSession, name: str, structured: dict[str, Any] | None) -> None:
    asyncio.run(session.validate_tool_result(name, _result(structured)))


def test_a_result_that_fits_passes_and_one_that_does_not_names_where() -> None:
    session = _session(counted=OUT)
    _check(session, "counted", {"n": 3})
    with pytest.raises(OutputMismatch, match=r"structuredContent\.n does not fit"):
        _check(session, "counted", {"n": "three"})
    with pytest.raises(OutputMismatch, match="gave no structuredContent"):
        _check(session, "counted", None)


def test_a_tool_without_an_output_schema_or_not_listed_is_not_checked() -> None:
    session = _session(counted=OUT)
    _check(session, "plain", None)
    _check(session, "never_listed", {"anything": 1})  # no second listing either


def test_a_pattern_that_backtracks_on_the_result_stops_at_the_budget() -> None:
    session = _session(out=BACKTRACKS)
    began = time.monotonic()
    with pytest.raises(OutputMismatch, match="took too long"):
        _check(session, "out", {"s": "a" * 60 + "b"})
    assert time.monotonic() - began < 5  # the SDK's own check: centuries
