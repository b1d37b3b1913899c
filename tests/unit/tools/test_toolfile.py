"""The tools-file loader: what it builds, and every error class at its file:line:column."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from execgate.executor.core.errors import ToolFileError, ToolFileErrors
from execgate.executor.tools import builtin_tools
from execgate.executor.tools.decl import OutputMode, Pool
from execgate.executor.tools.toolfile import load_tools, parse_sources

EXAMPLES = Path(__file__).parents[3] / "tools" / "examples.yaml"
RESERVED = frozenset(builtin_tools(test_tools=True))

GOOD = """\
version: 1
tools:
  - name: grep_one
    description: grep a file
    input_schema:
      type: object
      properties:
        pattern: {type: string}
        path: {type: string}
        extra: {type: array, items: {type: string}}
      required: [pattern, path]
    argv: [grep, -n, --, "{pattern}", "{path}", "{extra...}"]
    cwd: "."
    env:
      set: {LC_ALL: C}
      passthrough: [TZ]
      secrets: {TOKEN: EG_TOKEN}
    effects:
      reads: ["{path}"]
      write_tables: ["db/app.sqlite:{pattern}"]
    output: json
    success_codes: [0, 1]
    timeout_s: 5
    sandbox: {backend: process, limits: {memory_mb: 256, processes: 16}}
servers:
  - name: fs
    command: npx
    args: [-y, "@modelcontextprotocol/server-filesystem", "."]
    pool: run
    trusted: true
    timeout_s: 30
    max_message_kb: 64
    sandbox: {backend: docker, image: "registry.local:5000/mcp/fs:1.2@sha256:0f"}
    tools:
      write_file: {effects: {writes: ["{path}"]}, destructive: true}
"""


def parse(text: str, source: str = "t.yaml"):  # type: ignore[no-untyped-def]
    return parse_sources([(source, textwrap.dedent(text))], RESERVED)


def errors_of(text: str) -> list[str]:
    with pytest.raises(ToolFileError) as info:
        parse(text)
    return [str(e) for e in getattr(info.value, "errors", (info.value,))]


def test_a_full_file_builds_every_value() -> None:
    file = parse(GOOD)
    [tool] = file.commands
    assert tool.argv == ("grep", "-n", "--", "{pattern}", "{path}", "{extra...}")
    assert tool.env.secrets == (("TOKEN", "EG_TOKEN"),)
    assert tool.effects.declared
    assert tool.effects.reads == ("{path}",)
    assert tool.effects.may_write  # a table write
    assert tool.output is OutputMode.JSON
    assert tool.success_codes == (0, 1)
    assert tool.sandbox.backend == "process"
    assert tool.sandbox.timeout == 5.0
    assert dict(tool.sandbox.limits) == {"memory_bytes": 256 << 20, "processes": 16}
    assert (tool.at.source, tool.at.line) == ("t.yaml", 3)
    [server] = file.servers
    assert server.pool is Pool.RUN
    assert server.trusted
    assert server.sandbox.timeout == 30.0
    assert server.max_message_bytes == 64 << 10
    assert server.sandbox.backend == "docker"
    assert server.sandbox.image == "registry.local:5000/mcp/fs:1.2@sha256:0f"
    assert tool.sandbox.image == ""
    [(name, override)] = server.tools
    assert name == "write_file"
    assert override.destructive is True
    assert override.effects is not None
    assert override.effects.writes == ("{path}",)
    assert (override.at.source, override.at.line) == ("t.yaml", 35)  # named at discovery
    assert len(file.revision) == 64


def test_the_shipped_examples_load() -> None:
    file = load_tools(EXAMPLES, RESERVED)
    assert {c.name for c in file.commands} >= {"git_log", "pytest", "format_json"}


def tool(**over: str) -> str:
    """One tool entry, its keys replaced by the YAML lines given."""
    keys = {
        "name": "t",
        "description": "d",
        "input_schema": "{type: object, properties: {p: {type: string}}}",
        "argv": '[echo, "{p}"]',
    }
    keys.update(over)
    body = "".join(f"    {k}: {v}\n" for k, v in keys.items() if v)
    return "version: 1\ntools:\n  - " + body[4:]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (tool(bogus="1"), "t.yaml:7:5: tools[0]: unknown key 'bogus'"),
        (tool(name="a.b"), "t.yaml:3:11: tools[0].name: 'a.b' is not a name"),
        (tool(argv='[echo, "{q}"]'), "t.yaml:6:18: tools[0].argv[1]: {q} is not a property"),
        (tool(argv='[echo, "{p"]'), "t.yaml:6:18: tools[0].argv[1]: unmatched '{'"),
        (tool(argv='["{p...}"]'), "t.yaml:6:12: tools[0].argv[0]: the program cannot be a spread"),
        (tool(argv='[echo, "{p...}"]'), "tools[0].argv[1]: {p...} spreads an array argument"),
        (tool(argv="[]"), "t.yaml:6:11: tools[0].argv: must not be empty"),
        (tool(argv=""), "t.yaml:3:5: tools[0].argv: required"),
        (tool(input_schema="{type: strin}"), "tools[0].input_schema.type: not a valid JSON Schema"),
        (tool(input_schema="{type: string}"), "tools[0].input_schema.type: must be object"),
        (tool(input_schema="[1]"), "t.yaml:5:19: tools[0].input_schema: must be a mapping"),
        (tool(cwd='"{nope}"'), "t.yaml:7:10: tools[0].cwd: {nope} is not a property"),
        (tool(stdin='"{x}"'), "tools[0].stdin: {x} is not a property"),
        (tool(env="{set: {1A: x}}"), "t.yaml:7:17: tools[0].env.set: '1A' is not a variable name"),
        (tool(env="{secrets: {A: 'no-name'}}"), "tools[0].env.secrets.A: 'no-name' is not a var"),
        (tool(env="{set: {A: x}, passthrough: [A]}"), "A is given in more than one"),
        (tool(env="{shell: true}"), "t.yaml:7:11: tools[0].env: unknown key 'shell'"),
        (tool(effects='{reads: ["/etc/passwd"]}'), "tools[0].effects.reads[0]: paths are relative"),
        (tool(effects='{reads: ["{q}"]}'), "tools[0].effects.reads[0]: {q} is not a property"),
        (tool(effects='{read_tables: ["users"]}'), "a table is DATABASE_PATH:TABLE"),
        (
            tool(
                input_schema="{type: object, properties: {l: {type: array}}}",
                argv='[echo, "{l...}"]',
                effects='{writes: ["{l}"]}',
            ),
            "tools[0].effects.writes[0]: {l} is of type array: a path needs a string",
        ),
        (tool(effects='{net: ["a b"]}'), "tools[0].effects.net[0]: 'a b' is not a host name"),
        (tool(effects="{deletes: []}"), "tools[0].effects: unknown key 'deletes'"),
        (tool(sandbox="{backend: lxc}"), "t.yaml:7:24: tools[0].sandbox.backend: must be one of"),
        (tool(sandbox="{limits: {memory_mb: 1}}"), "tools[0].sandbox.limits.memory_mb"),
        (tool(sandbox="{limits: {network: 1}}"), "tools[0].sandbox.limits: unknown key 'network'"),
        (tool(timeout_s="-1"), "t.yaml:7:16: tools[0].timeout_s"),
        (tool(output="xml"), "t.yaml:7:13: tools[0].output: must be one of text, json"),
        (tool(success_codes="[256]"), "tools[0].success_codes[0]: must be an exit status"),
        (tool(option_args="[q]"), "tools[0].option_args[0]: {q} is not a property"),
        (tool(idempotent="yes please"), "t.yaml:7:17: tools[0].idempotent: must be true or false"),
        (tool(description="''"), "tools[0].description: must be a non-empty string"),
        (tool(name="read_file"), "t.yaml:3: tool 'read_file': a built-in tool has this name"),
        ("version: 2\n", "t.yaml:1:10: version: required, must be 1"),
        ("version: 1\ntools: {}\n", "t.yaml:2:8: tools: must be a list"),
        ("version: 1\nversion: 1\n", "t.yaml:2:1: file: 'version' appears twice"),
        ("version: 1\nmcp: []\n", "t.yaml:2:1: file: unknown key 'mcp'"),
        ("version: 1\ntools: [\n", "t.yaml:3:1: not valid YAML"),
        ("version: 1\nservers: [{name: s}]\n", "t.yaml:2:11: servers[0].command: required"),
        ("version: 1\nservers: [{name: s, command: x, pool: x}]\n", "servers[0].pool: must be one"),
        (
            "version: 1\nservers: [{name: s, command: x, max_message_kb: 0.5}]\n",
            "t.yaml:2:49: servers[0].max_message_kb: must be an integer from 1 to 1048576 (KiB)",
        ),
        (
            "version: 1\nservers: [{name: s, command: x, tools: {t: {hid: 1}}}]\n",
            "unknown key 'hid'",
        ),
        (
            "version: 1\nservers: [{name: s, command: x, sandbox: {image: 'a b'}}]\n",
            "t.yaml:2:50: servers[0].sandbox.image: 'a b' is not a docker image reference",
        ),
        (
            "version: 1\nservers: [{name: s, command: x, sandbox: {image: busybox}}]\n",
            "t.yaml:2:50: servers[0].sandbox.image: only with backend: docker, not default",
        ),
        (
            "version: 1\nservers: [{name: s, command: x, sandbox: {backend: bwrap, image: b}}]\n",
            "servers[0].sandbox.image: only with backend: docker, not bwrap",
        ),
        (
            "version: 1\nservers: [{name: s, command: x, sandbox: {image: ''}}]\n",
            "servers[0].sandbox.image: must be a non-empty string",
        ),
        (tool(sandbox="{backend: docker, image: b}"), "tools[0].sandbox: unknown key 'image'"),
    ],
)
def test_each_error_names_its_place_and_field(entry: str, expected: str) -> None:
    found = errors_of(entry)
    assert any(expected in e for e in found), found


def test_a_key_twice_inside_an_input_schema_is_an_error() -> None:
    text = tool(input_schema="{type: object, properties: {p: {type: string}}, type: object}")
    assert "t.yaml:5:67: tools[0].input_schema: 'type' appears twice" in errors_of(text)[0]


def test_an_input_schema_referring_outside_itself_is_an_error() -> None:
    """jsonschema would fetch it (urllib, the daemon's network, no timeout): refused."""
    inside = "{type: object, $defs: {s: {type: string}}, properties: {p: {$ref: '#/$defs/s'}}}"
    [command] = parse(tool(input_schema=inside)).commands
    assert command.input_schema["properties"]["p"] == {"$ref": "#/$defs/s"}
    outside = "{type: object, properties: {p: {$ref: 'http://10.0.0.1/s.json'}}}"
    [found] = errors_of(tool(input_schema=outside))
    assert "tools[0].input_schema: refers to 'http://10.0.0.1/s.json'" in found, found


def test_an_input_schema_whose_patterns_cannot_be_bounded_is_an_error() -> None:
    by_name = "{type: object, patternProperties: {'^x': {type: string}}}"
    [found] = errors_of(tool(input_schema=by_name))
    assert "tools[0].input_schema: patternProperties is not supported" in found, found
    huge = "{type: object, properties: {p: {type: string, pattern: '((a{1000}){1000}){1000}'}}}"
    [found] = errors_of(tool(input_schema=huge))
    assert "tools[0].input_schema: pattern '((a{1000}){1000}){1000}': " in found, found


def test_every_bad_entry_is_reported_in_file_order() -> None:
    text = tool(bogus="1") + "  - {name: u, description: d, input_schema: {type: object}}\n"
    found = errors_of(text)
    assert [e.split(":")[1] for e in found] == ["7", "8"]
    assert "tools[1].argv: required" in found[1]


def test_names_are_unique_across_a_directory_and_errors_name_their_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(tool(name="dup"))
    (tmp_path / "b.yaml").write_text(tool(name="dup"))
    (tmp_path / "c.yaml").write_text(tool(output="xml"))
    (tmp_path / "notes.txt").write_text("not yaml: [")  # only *.yaml counts
    with pytest.raises(ToolFileErrors) as info:
        load_tools(tmp_path, RESERVED)
    found = [str(e) for e in info.value.errors]
    assert any(e.startswith(f"{tmp_path / 'c.yaml'}:7:13: tools[0].output") for e in found)
    assert any(
        e.startswith(f"{tmp_path / 'b.yaml'}:3:")
        and f"already declared at {tmp_path / 'a.yaml'}:3" in e
        for e in found
    ), found


def test_an_empty_directory_and_an_empty_file_declare_nothing(tmp_path: Path) -> None:
    assert load_tools(tmp_path).commands == ()
    (tmp_path / "empty.yaml").write_text("")
    assert load_tools(tmp_path).commands == ()


def test_effects_left_out_mean_the_whole_workspace_and_empty_effects_mean_none() -> None:
    undeclared = parse(tool()).commands[0].effects
    assert not undeclared.declared
    assert undeclared.may_write
    nothing = parse(tool(effects="{}")).commands[0].effects
    assert nothing.declared
    assert not nothing.may_write


def test_a_server_moved_down_the_file_is_the_same_server() -> None:
    server = "servers:\n  - {name: s, command: x}\n"
    before = parse("version: 1\n" + server)
    after = parse("version: 1\n" + tool()[len("version: 1\n") :] + server)
    assert before.servers[0].at.line != after.servers[0].at.line
    assert before.servers == after.servers
