"""A declared command tool: argv expansion through a real program that prints its argv,
effects as claims, secrets cut from the output, exit codes and JSON output."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Mode, net_key, path_key, table_key, workspace_key
from execgate.executor.sandbox.process import ProcessSandbox
from execgate.executor.tools import Limits, ToolContext, ToolOutput
from execgate.executor.tools.decl import CommandDecl, EffectsDecl, EnvDecl, OutputMode
from execgate.executor.tools.declared import CommandTool, Prepared

PRINT_ARGV = (sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))")
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "a": {"type": "string"},
        "b": {"type": "string"},
        "many": {"type": "array", "items": {"type": "string"}},
        "n": {"type": "integer"},
    },
}
# Each must arrive as exactly one argv element, byte for byte.
INJECTIONS = [
    "; rm -rf /",
    "$(id)",
    "`id`",
    "-rf",
    "--help",
    "a\nb",
    "two words",
    "*",
    "../*",
    "x' || true #",
    '" ; echo pwned "',
    "{a}",
    "",
]


def decl(**over: Any) -> CommandDecl:
    fields: dict[str, Any] = {
        "name": "t",
        "description": "d",
        "input_schema": SCHEMA,
        "argv": (*PRINT_ARGV, "{a}"),
    }
    fields.update(over)
    return CommandDecl(**fields)


def run(tool: CommandTool, args: dict[str, Any], ws: Workspace) -> ToolOutput:
    ctx = ToolContext(ws, Limits(), 20.0, sandbox=ProcessSandbox())
    ctx.analysis = tool.call_effects(args, {}, ws).detail
    return asyncio.run(tool.run(args, ctx))


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / "ws").mkdir()
    return Workspace(tmp_path / "ws")


@pytest.mark.parametrize("value", INJECTIONS)
def test_an_argument_stays_one_argv_element_whatever_it_holds(value: str, ws: Workspace) -> None:
    out = run(CommandTool(decl(argv=(*PRINT_ARGV, "--x={a}", "--", "{a}"))), {"a": value}, ws)
    assert out.error_class is ErrorClass.NONE, out.message
    assert json.loads(out.text) == [f"--x={value}", "--", value]


def test_a_spread_gives_one_element_per_item_and_absent_arguments_leave_theirs_out(
    ws: Workspace,
) -> None:
    argv = (*PRINT_ARGV, "{many...}", "--n={n}", "{b}", "{{lit}}")
    tool = CommandTool(decl(argv=argv, option_args=("many",)))
    out = run(tool, {"many": ["-a", "b c", "$(id)"], "n": 3}, ws)
    assert json.loads(out.text) == ["-a", "b c", "$(id)", "--n=3", "{lit}"]


@pytest.mark.parametrize(
    ("argv", "args", "field"),
    [
        (("{a}",), {"a": "-rf"}, "arguments.a"),
        (("{a}{b}",), {"a": "", "b": "--help"}, "arguments.b"),
        (("{a}.txt",), {"a": "-"}, "arguments.a"),
        (("{many...}",), {"many": ["ok", "-x"]}, "arguments.many[1]"),
        (("{b}", "--", "{a}"), {"a": "-ok", "b": "-no"}, "arguments.b"),
    ],
)
def test_an_argument_that_would_be_read_as_an_option_is_rejected(
    argv: tuple[str, ...], args: dict[str, Any], field: str, ws: Workspace
) -> None:
    tool = CommandTool(decl(argv=(*PRINT_ARGV, *argv)))
    with pytest.raises(ToolError) as info:
        tool.call_effects(args, {}, ws)
    assert (info.value.status, info.value.error_class, info.value.field) == (
        Status.REJECTED,
        ErrorClass.INVALID_ARGUMENT,
        field,
    )


def test_an_element_the_operator_starts_with_a_dash_is_never_refused(ws: Workspace) -> None:
    tool = CommandTool(decl(argv=(*PRINT_ARGV, "--n={a}", "x{a}")))
    assert json.loads(run(tool, {"a": "-1"}, ws).text) == ["--n=-1", "x-1"]


@pytest.mark.parametrize(
    ("args", "field"),
    [({"a": "x\x00y"}, "arguments.a"), ({"many": ["ok", "\x00"]}, "arguments.many[1]")],
)
def test_a_nul_byte_is_rejected_naming_the_argument(
    args: dict[str, Any], field: str, ws: Workspace
) -> None:
    tool = CommandTool(decl(argv=(*PRINT_ARGV, "{a}", "{many...}")))
    with pytest.raises(ToolError) as info:
        tool.call_effects(args, {}, ws)
    assert (info.value.status, info.value.error_class, info.value.field) == (
        Status.REJECTED,
        ErrorClass.INVALID_ARGUMENT,
        field,
    )


def test_stdin_comes_from_an_argument(ws: Workspace) -> None:
    tool = CommandTool(
        decl(argv=(sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"), stdin="{a}")
    )
    assert run(tool, {"a": "abc"}, ws).text.strip() == "cba"


def test_effects_become_claims_on_canonical_keys(ws: Workspace) -> None:
    (ws.root / "sub").mkdir()
    effects = EffectsDecl(
        declared=True,
        reads=("sub/../{a}",),
        writes=("out/{b}",),
        write_tables=("data.db:{b}",),
        net=("api.example.com",),
    )
    tool = CommandTool(decl(effects=effects))
    got = tool.call_effects({"a": "in.txt", "b": "T"}, {}, ws)
    assert [(c.key, c.mode) for c in got.claims] == [
        (path_key(ws.lock_root, "in.txt"), Mode.READ),
        (path_key(ws.lock_root, "out/T"), Mode.WRITE),
        (table_key(ws.lock_root, "data.db", "t"), Mode.WRITE),
        # SQLite makes its journal beside the database: the sandbox binds that
        # directory (here the workspace's root) writable, so the call writes it.
        (path_key(ws.lock_root, "."), Mode.WRITE),
        (net_key("api.example.com"), Mode.READ),
    ]
    assert got.may_write
    assert isinstance(got.detail, Prepared)
    assert set(got.paths) == {"effects.reads[0]", "effects.writes[0]"}
    # What the sandbox makes writable: the declared path (made if missing) and the
    # database's directory.
    assert got.confined is not None
    assert [(d.field, d.path, d.directory) for d in got.confined] == [
        ("arguments.b", ws.root / "out/T", False),
        ("effects.write_tables (.)", ws.root, True),
    ]
    assert not CommandTool(decl(effects=EffectsDecl(declared=True, reads=("{a}",)))).spec.may_write


def test_literal_effects_are_claimed_whatever_the_call_gives(ws: Workspace) -> None:
    """A template without placeholders is always given: `docs`, `app.db:users`."""
    effects = EffectsDecl(declared=True, reads=("docs",), write_tables=("app.db:users",))
    got = CommandTool(decl(effects=effects)).call_effects({}, {}, ws)
    assert [(c.key, c.mode) for c in got.claims] == [
        (path_key(ws.lock_root, "docs"), Mode.READ),
        (table_key(ws.lock_root, "app.db", "users"), Mode.WRITE),
        (path_key(ws.lock_root, "."), Mode.WRITE),  # the database's directory
    ]
    assert set(got.paths) == {"effects.reads[0]"}


def test_undeclared_effects_write_the_whole_workspace(ws: Workspace) -> None:
    got = CommandTool(decl()).call_effects({"a": "x"}, {}, ws)
    assert [(c.key, c.mode) for c in got.claims] == [(workspace_key(ws.lock_root), Mode.WRITE)]
    assert got.may_write


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "a/../../x"])
def test_an_effect_outside_the_workspace_is_rejected_naming_the_argument(
    path: str, ws: Workspace
) -> None:
    tool = CommandTool(decl(effects=EffectsDecl(declared=True, writes=("{a}",))))
    with pytest.raises(ToolError) as info:
        tool.call_effects({"a": path}, {}, ws)
    assert (info.value.status, info.value.field) == (Status.REJECTED, "arguments.a")


def test_a_secret_reaches_the_child_and_never_its_result(ws: Workspace) -> None:
    env = EnvDecl(secrets=(("TOKEN", "EG_TEST_TOKEN"),), set=(("MODE", "x"),))
    argv = (
        sys.executable,
        "-c",
        "import os,sys; print(os.environ['TOKEN']); "
        "print('err', os.environ['TOKEN'], os.environ['MODE'], file=sys.stderr)",
    )
    tool = CommandTool(decl(argv=argv, env=env), environ={"EG_TEST_TOKEN": "s3cr3t-v4lue"})
    out = run(tool, {}, ws)
    assert "s3cr3t-v4lue" not in out.text + out.raw() + out.message
    assert out.text.count("[secret TOKEN]") == 2
    assert "x" in out.text


def test_a_missing_secret_is_rejected_by_name_before_the_call_starts(ws: Workspace) -> None:
    tool = CommandTool(decl(env=EnvDecl(secrets=(("TOKEN", "EG_NOT_SET"),))), environ={})
    with pytest.raises(ToolError) as info:
        tool.check({})
    assert (info.value.status, info.value.field) == (Status.REJECTED, "secrets.TOKEN")
    assert "EG_NOT_SET" in info.value.message


def test_success_codes_decide_success_and_failure(ws: Workspace) -> None:
    argv = (sys.executable, "-c", "import sys; sys.exit(int(sys.argv[1]))", "{a}")
    tool = CommandTool(decl(argv=argv, success_codes=(1, 5)))
    assert run(tool, {"a": "5"}, ws).error_class is ErrorClass.NONE
    failed = run(tool, {"a": "0"}, ws)
    assert failed.error_class is ErrorClass.NONZERO_EXIT
    assert "not a success code" in failed.message
    assert run(tool, {"a": "3"}, ws).error_class is ErrorClass.NONZERO_EXIT


def test_json_output_becomes_the_structured_result(ws: Workspace) -> None:
    argv = (sys.executable, "-c", "import sys; print(sys.argv[1])", "{a}")
    tool = CommandTool(decl(argv=argv, output=OutputMode.JSON))
    assert run(tool, {"a": '{"k": [1, 2]}'}, ws).structured == {"k": [1, 2]}
    assert run(tool, {"a": "[3]"}, ws).structured == {"value": [3]}
    bad = run(tool, {"a": "not json"}, ws)
    assert bad.error_class is ErrorClass.IO_ERROR
    assert "stdout is not JSON" in bad.message
