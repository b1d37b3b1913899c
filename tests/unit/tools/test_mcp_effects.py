"""Who is believed about an MCP tool (effects.py), and which schemas it may serve."""

from __future__ import annotations

from pathlib import Path

import mcp.types as mcp_types
import pytest

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import Status
from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Mode, net_key, path_key, table_key
from execgate.executor.locks.keys import server_key
from execgate.executor.tools.decl import EffectsDecl, Located, ServerDecl, ToolOverride
from execgate.executor.tools.effects import CallEffects
from execgate.executor.tools.mcp.effects import call_effects, hints
from execgate.executor.tools.mcp.provider import override_problem, schema_problem

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
    assert [(c.key.render(), c.mode) for c in effects.claims] == [("mcp:s", Mode.READ)]


def _effects(ws: Path, args: dict[str, object], **templates: tuple[str, ...]) -> CallEffects:
    effects = EffectsDecl(declared=True, **templates)
    believed = hints(ServerDecl(name="s", command="x"), _tool(None), ToolOverride(effects=effects))
    return call_effects("s", believed, effects, args, Workspace(ws), workspace_writable=True)


def test_templates_are_the_command_tools_templates(tmp_path: Path) -> None:
    """One syntax (template.py): `{{`/`}}` are braces, a name may hold `-` (MCP tools'
    `file-path`, `dry-run`), a literal path is claimed as it is."""
    got = _effects(
        tmp_path,
        {"file-path": "a.txt", "dir": "d", "name": "n", "db": "app.db", "host": "h.example"},
        reads=("{dir}/{{x}}/{name}", "docs"),
        writes=("{file-path}",),
        read_tables=("{db}:users",),
        write_tables=("app.db:items",),
        net=("{host}",),
    )
    assert [(c.key, c.mode) for c in got.claims] == [
        (server_key("s", str(tmp_path.resolve())), Mode.READ),
        (path_key(str(tmp_path.resolve()), "d/{x}/n"), Mode.READ),
        (path_key(str(tmp_path.resolve()), "docs"), Mode.READ),
        (path_key(str(tmp_path.resolve()), "a.txt"), Mode.WRITE),
        (table_key(str(tmp_path.resolve()), "app.db", "users"), Mode.READ),
        (table_key(str(tmp_path.resolve()), "app.db", "items"), Mode.WRITE),
        (net_key("h.example"), Mode.READ),
    ]
    assert got.may_write
    # The policy sees the resolved paths, as a command tool's.
    assert got.paths == {
        "effects.reads[0]": tmp_path.resolve() / "d/{x}/n",
        "effects.reads[1]": tmp_path.resolve() / "docs",
        "effects.writes[0]": tmp_path.resolve() / "a.txt",
    }


@pytest.mark.parametrize(
    ("templates", "args", "field"),
    [
        ({"writes": ("{file-path}",)}, {}, "arguments.file-path"),  # absent: REJECTED
        ({"writes": ("{p}",)}, {"p": ["a"]}, "arguments.p"),
        ({"writes": ("{p}",)}, {"p": {"a": "b"}}, "arguments.p"),
        ({"reads": ("{p}",)}, {"p": True}, "arguments.p"),
        ({"write_tables": ("{db}:t",)}, {"db": ["../x.db"]}, "arguments.db"),
        ({"writes": ("{dir}/{name}",)}, {"dir": "d"}, "arguments.name"),
        ({"net": ("{host}",)}, {}, "arguments.host"),
        ({"net": ("{host}",)}, {"host": "."}, "arguments.host"),  # names no host
        ({"write_tables": ("app.db:{t}",)}, {"t": ""}, "arguments.t"),  # no table
    ],
)
def test_an_argument_that_is_no_path_is_rejected_naming_it(
    tmp_path: Path, templates: dict[str, tuple[str, ...]], args: dict[str, object], field: str
) -> None:
    with pytest.raises(ToolError) as info:
        _effects(tmp_path, args, **templates)
    assert (info.value.status, info.value.error_class.value, info.value.field) == (
        Status.REJECTED,
        "invalid_argument",
        field,
    ), info.value.message


@pytest.mark.parametrize(
    ("templates", "args", "field"),
    [
        ({"writes": ("{file-path}",)}, {"file-path": "../../x"}, "arguments.file-path"),
        ({"writes": ("out/{name}",)}, {"name": "/etc/passwd"}, "arguments.name"),
        ({"read_tables": ("{db}:t",)}, {"db": "../x.db"}, "arguments.db"),
    ],
)
def test_an_escape_is_rejected_naming_the_argument(
    tmp_path: Path, templates: dict[str, tuple[str, ...]], args: dict[str, object], field: str
) -> None:
    with pytest.raises(ToolError) as info:
        _effects(tmp_path, args, **templates)
    assert (info.value.status, info.value.error_class.value, info.value.field) == (
        Status.REJECTED,
        "permission_denied",
        field,
    ), info.value.message


def test_an_override_must_fit_the_tools_schema() -> None:
    """Checked when the server lists the tool, as a command tool's at load."""
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "paths": {"type": "array"}, "on": {}},
    }
    at = Located(source="tools.yaml", line=7)

    def problem(**templates: tuple[str, ...]) -> str:
        override = ToolOverride(effects=EffectsDecl(declared=True, **templates), at=at)
        return override_problem("t", override, schema)

    assert problem(reads=("{path}",), writes=("{on}",), net=("{on}",)) == ""
    assert problem(reads=("{nope}",)) == (
        "tools.yaml:7: tools.t.effects.reads[0]: {nope} is not a property of the tool's "
        "inputSchema (properties: on, path, paths)"
    )
    assert problem(writes=("a", "{paths}")) == (
        "tools.yaml:7: tools.t.effects.writes[1]: {paths} is of type array: a path needs a string"
    )
    assert "effects.net[0]: {x} is not a property" in problem(
        read_tables=("db:{path}",), net=("{x}",)
    )
    assert "effects.write_tables[0]: {paths} is of type array" in problem(
        write_tables=("{paths}:t",)
    )
    assert override_problem("t", ToolOverride(read_only=True), schema) == ""
    assert "not a property" in override_problem(
        "t", ToolOverride(effects=EffectsDecl(declared=True, reads=("{p}",))), {"type": "object"}
    )


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
