"""Who is believed about an MCP tool (effects.py), and which schemas it may serve."""

from __future__ import annotations

from pathlib import Path

import mcp.types as mcp_types
import pytest

from execgate.executor.core.errors import ToolError
from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Mode
from execgate.executor.tools.decl import EffectsDecl, ServerDecl, ToolOverride
from execgate.executor.tools.mcp.effects import call_effects, hints, render
from execgate.executor.tools.mcp.provider import schema_problem

READER = mcp_types.ToolAnnotations(read_only_hint=True)


def _tool(annotations: mcp_types.ToolAnnotations | None) -> mcp_types.Tool:
    return mcp_types.Tool(name="t", input_schema={"type": "object"}, annotations=annotations)


def test_annotations_only_of_a_trusted_server() -> None:
    untrusted = ServerDecl(name="s", command="x")
    trusted = ServerDecl(name="s", command="x", trusted=True)
    assert not hints(untrusted, _tool(READER), None).read_only
    assert hints(trusted, _tool(READER), None).read_only
    assert not hints(trusted, _tool(None), None).read_only  # says nothing: a writer
    assert hints(untrusted, _tool(None), ToolOverride(read_only=True)).read_only


def test_a_reader_reads_the_server_key(tmp_path: Path) -> None:
    trusted = ServerDecl(name="s", command="x", trusted=True)
    effects = call_effects(
        "s",
        hints(trusted, _tool(READER), None),
        None,
        {},
        Workspace(tmp_path),
        workspace_writable=True,
    )
    assert not effects.may_write
    assert [(c.key.render(str(tmp_path)), c.mode) for c in effects.claims] == [("mcp:s", Mode.READ)]


def test_templates_render_arguments_and_refuse_what_they_cannot() -> None:
    assert render("{dir}/{{x}}/{name}", {"dir": "a", "name": "b"}) == "a/{x}/b"
    with pytest.raises(ToolError, match="needs argument 'name'"):
        render("{name}", {})
    with pytest.raises(ToolError, match="must be a string"):
        render("{name}", {"name": ["a"]})


def test_declared_effects_are_confined(tmp_path: Path) -> None:
    decl = ServerDecl(name="s", command="x")
    effects = EffectsDecl(declared=True, reads=("{path}",))
    believed = hints(decl, _tool(None), ToolOverride(effects=effects))
    assert believed.read_only
    with pytest.raises(ToolError, match="outside the workspace"):
        call_effects(
            "s",
            believed,
            effects,
            {"path": "/etc/passwd"},
            Workspace(tmp_path),
            workspace_writable=False,
        )


def test_schemas_the_daemon_cannot_validate_with_are_refused() -> None:
    assert schema_problem({"type": "object", "properties": {"a": {"type": "string"}}}) == ""
    assert "not a valid JSON Schema" in schema_problem({"type": "nonsense"})
    assert schema_problem(["not", "an", "object"]) == "its inputSchema is not an object"
