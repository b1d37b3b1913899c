"""Argument injection into a declared command tool, through the real daemon and bwrap:
whatever an argument holds (shell syntax, options, newlines, globs), each template is
exactly one argv element; nothing reaches a shell; NUL is REJECTED naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from execgate.client import Call, Client, Status
from tests.daemon import Daemon

CORPUS = [
    "; rm -rf /",
    "&& touch pwned",
    "| touch pwned",
    "$(touch pwned)",
    "`touch pwned`",
    "${IFS}touch${IFS}pwned",
    "-rf",
    "--output=/etc/passwd",
    "-",
    "a\nb\n--c",
    "\r\n",
    "two words  and\ttabs",
    "*",
    "/*",
    "~",
    "'single' \"double\"",
    "{arg}",
    "{{arg}}",
    "",
    "é ✓ \u202e",
]
OPTIONS = [v for v in CORPUS if v.startswith("-")]


def _argv_tool(name: str, args: list[str]) -> dict[str, object]:
    """A tool that prints the argv it was handed, as JSON."""
    return {
        "name": name,
        "description": "prints its argv as JSON",
        "input_schema": {
            "type": "object",
            "properties": {
                "arg": {"type": "string"},
                "more": {"type": "array", "items": {"type": "string"}},
            },
        },
        "argv": ["python3", "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", *args],
        "effects": {},
    }


TOOLS = {
    "version": 1,
    "tools": [
        _argv_tool("argv", ["{arg}", "--flag={arg}", "{more...}"]),
        _argv_tool("argv_after_dashes", ["--", "{arg}", "--flag={arg}", "{more...}"]),
        {**_argv_tool("argv_options", ["{arg}", "{more...}"]), "option_args": ["arg", "more"]},
        {
            # `files` has no type, so the file loads; an array given for it must not
            # have its JSON text checked as the path ("../../x"] is a dir name).
            "name": "touch_any",
            "description": "touches what it is given",
            "input_schema": {"type": "object", "properties": {"files": {}}},
            "argv": ["touch", "{files}"],
            "effects": {"writes": ["{files}"]},
        },
        {
            # Effects whose keys an argument names: a host, a table.
            "name": "reach",
            "description": "reaches a host, writes a table",
            "input_schema": {
                "type": "object",
                "properties": {"host": {"type": "string"}, "table": {"type": "string"}},
            },
            "argv": ["true"],
            "effects": {"net": ["{host}"], "write_tables": ["app.db:{table}"]},
        },
    ],
}
POLICY = {
    "version": 1,
    "default": "deny",
    "rules": [{"id": "all", "effect": "allow", "tools": ["argv*", "touch_any", "reach"]}],
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Client]]:
    root = tmp_path_factory.mktemp("inject")
    (root / "tools.yaml").write_text(yaml.safe_dump(TOOLS))
    (root / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    (root / "d").mkdir()
    d = Daemon(
        root / "d", "--tools", str(root / "tools.yaml"), "--policy", str(root / "policy.yaml")
    )
    d.start()
    try:
        with Client(d.address) as c:
            yield d, c
    finally:
        d.stop()


def test_every_injection_stays_one_element(client: tuple[Daemon, Client]) -> None:
    d, c = client
    values = [v for v in CORPUS if v not in OPTIONS]
    calls = [Call(tool="argv", arguments={"arg": v, "more": [v, v]}) for v in values]
    for value, o in zip(values, c.execute(calls), strict=True):
        assert o.status is Status.SUCCESS, (value, o.message)
        assert json.loads(o.text) == [value, f"--flag={value}", value, value], value
    assert not list(d.workspace.rglob("pwned"))
    assert not (Path.cwd() / "pwned").exists()


@pytest.mark.parametrize("value", OPTIONS)
@pytest.mark.parametrize(
    ("args", "field"),
    [(lambda v: {"arg": v}, "arguments.arg"), (lambda v: {"more": ["ok", v]}, "arguments.more[1]")],
)
def test_a_value_that_would_be_read_as_an_option_is_rejected(
    client: tuple[Daemon, Client], value: str, args: Callable[[str], dict[str, object]], field: str
) -> None:
    _, c = client
    o = c.run(Call(tool="argv", arguments=args(value)))
    assert (o.status, o.error_class, o.field) == (Status.REJECTED, "invalid_argument", field)
    assert "option" in o.message
    assert o.mark("started") is None


def test_after_dashes_and_where_options_are_allowed_a_dash_is_one_element(
    client: tuple[Daemon, Client],
) -> None:
    _, c = client
    after = [Call(tool="argv_after_dashes", arguments={"arg": v, "more": [v]}) for v in OPTIONS]
    for value, o in zip(OPTIONS, c.execute(after), strict=True):
        assert o.status is Status.SUCCESS, (value, o.message)
        assert json.loads(o.text) == ["--", value, f"--flag={value}", value], value
    allowed = [Call(tool="argv_options", arguments={"arg": v, "more": [v]}) for v in OPTIONS]
    for value, o in zip(OPTIONS, c.execute(allowed), strict=True):
        assert o.status is Status.SUCCESS, (value, o.message)
        assert json.loads(o.text) == [value, value], value


@pytest.mark.parametrize(
    ("args", "field"),
    [({"arg": "a\x00b"}, "arguments.arg"), ({"more": ["ok", "x\x00"]}, "arguments.more[1]")],
)
def test_nul_is_rejected_before_the_call_starts(
    client: tuple[Daemon, Client], args: dict[str, object], field: str
) -> None:
    _, c = client
    o = c.run(Call(tool="argv", arguments=args))
    assert (o.status, o.error_class, o.field) == (Status.REJECTED, "invalid_argument", field)
    assert o.mark("started") is None


@pytest.mark.parametrize("value", [["../../tmp/eg-pwned"], {"a": "../x"}, True])
def test_an_effects_path_given_a_non_scalar_is_rejected(
    client: tuple[Daemon, Client], value: object
) -> None:
    _, c = client
    o = c.run(Call(tool="touch_any", arguments={"files": value}))
    assert (o.status, o.error_class, o.field) == (
        Status.REJECTED,
        "invalid_argument",
        "arguments.files",
    ), o.message
    assert o.mark("started") is None
    assert not Path("/tmp/eg-pwned").exists()


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"host": "."}, "arguments.host"),
        ({"host": ".."}, "arguments.host"),
        ({"table": ""}, "arguments.table"),
    ],
)
def test_a_host_or_table_that_names_nothing_is_rejected_naming_it(
    client: tuple[Daemon, Client], arguments: dict[str, str], field: str
) -> None:
    """FINDING (low): the lock key's ValueError ("host is empty", "table name is
    empty") escaped the analysis: the call ended REJECTED `internal`, a traceback in
    the log, instead of a typed error naming the argument."""
    d, c = client
    o = c.run(Call(tool="reach", arguments=arguments))
    assert (o.status, o.error_class, o.field) == (Status.REJECTED, "invalid_argument", field), o
    assert o.mark("started") is None
    assert "failed inside the daemon" not in d.log()
