"""Security review of MCP servers (merge17): each test is the proof of one finding,
through the real daemon on a real socket, the servers in the real bwrap sandbox.

A. A server's `env.secrets` value (from the daemon's environment) came back wherever
   the server wrote it: its results, errors, progress, its tools' descriptions, the
   stderr quoted when it fails to start (ListProviders, `execgate doctor`, the log).
B. Per-tool overrides' effects: tables were dropped, `{file-path}` did not render, a
   template naming no argument of the tool was taken, and a list given for a path
   crashed the check instead of being REJECTED."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execgate.client import Call, Client, EventKind, Outcome, Status
from tests import mcp_support as ms
from tests.daemon import Daemon
from tests.support import sandbox_serve_args

pytestmark = pytest.mark.timeout(180)

# A quote, a backslash and a non-ASCII letter: its JSON forms all differ from it.
SECRET = 'mcp"\\é-' + uuid.uuid4().hex
FORMS = (SECRET, json.dumps(SECRET)[1:-1], json.dumps(SECRET, ensure_ascii=False)[1:-1])
MASK = "[secret FIXTURE_SECRET]"
SECRETS = {"FIXTURE_SECRET": "EG_MCP_REVIEW_SECRET"}
POLICY = """\
version: 1
default: deny
rules:
  - {id: no-secret-file, effect: deny, paths: ["**/secret.txt"]}
  - {id: no-items, effect: deny, tables: [items]}
  - {id: mine, effect: allow, tools: ["leaky.*", "nostart.*", "fs.*"]}
"""
UNTOUCHED = "UNTOUCHED-" + uuid.uuid4().hex


def _server(name: str, server: tuple[str, tuple[str, ...]], tag: str, **kw: Any) -> dict[str, Any]:
    command, args = server
    env = {"set": {ms.TAG_ENV: tag, **kw.pop("set", {})}, "secrets": SECRETS}
    return {"name": name, "command": command, "args": list(args), "env": env, **kw}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Client]]:
    root = tmp_path_factory.mktemp("mcp-review")
    tag = ms.new_tag()
    ws = root / "workspace"
    servers = [
        _server(
            "leaky",
            ms.fixture_server(),
            tag,
            tools={
                "put_at": {"effects": {"writes": ["{file-path}"]}},
                "write_any": {"effects": {"writes": ["{target}"]}},
                "fill_table": {"effects": {"write_tables": ["{db}:items"]}},
            },
        ),
        _server("nostart", ms.fixture_server(), tag, set={"FAULTY_FAIL_AT_START": "1"}),
        _server(
            "fs",
            ms.npm_server("server-filesystem", str(ws)),
            tag,
            trusted=True,
            tools={
                "write_file": {"effects": {"writes": ["{path}"]}},
                "read_text_file": {"effects": {"reads": ["{nope}"]}},
                "read_multiple_files": {"effects": {"reads": ["{paths}"]}},
            },
        ),
    ]
    ms.tools_file(root / "tools.yaml", servers)
    (root / "policy.yaml").write_text(POLICY)
    (root / "outside.txt").write_text(UNTOUCHED)
    ws.mkdir()
    (ws / "notes").mkdir()
    d = Daemon(
        root,
        *sandbox_serve_args("bwrap", root),
        *[a for p in ms.RO_PATHS for a in ("--sandbox-ro", str(p))],
        "--policy",
        str(root / "policy.yaml"),
        "--tools",
        str(root / "tools.yaml"),
        env={"EG_MCP_REVIEW_SECRET": SECRET},
    ).start(timeout=60)
    try:
        with Client(d.address) as c:
            yield d, c
    finally:
        d.stop()
        ms.wait_for(lambda: ms.tagged(tag) == [], 10, "every server gone with the daemon")


def _texts(o: Outcome) -> str:
    """Every text of an outcome the client gets."""
    parts = [o.text, o.message, o.field, json.dumps(o.structured, ensure_ascii=False)]
    return "\n".join(parts + [m.detail for m in o.timeline])


def _nowhere(d: Daemon, *seen: str) -> None:
    """No form of the secret in `seen`, the journal's files (the WAL too) or the log."""
    journal = b"".join(p.read_bytes() for p in d.state_dir.rglob("*") if p.is_file())
    assert journal, "no journal found: this would prove nothing"
    for form in FORMS:
        assert form.encode() not in journal, f"the journal holds {form!r}"
        assert form not in d.log(), f"the daemon's log holds {form!r}"
        for text in seen:
            assert form not in text, (form, text)


# -- A. secrets -----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["text", "error", "rpc_error"])
def test_a_secret_a_server_answers_with_is_cut(live: tuple[Daemon, Client], where: str) -> None:
    """FINDING (high): results, isError texts and JSON-RPC errors carried the value
    (as it is, and JSON-escaped in the server's JSON text) to the client and journal."""
    d, c = live
    o = c.run(Call(tool="leaky.leak", arguments={"where": where}))
    expected = (Status.SUCCESS, "none") if where == "text" else (Status.FAILURE, "tool_error")
    assert (o.status, o.error_class) == expected, o.message
    shown = o.text if where == "text" else o.message
    assert shown.count(MASK) == 2, shown  # the raw value, and in the server's JSON
    _nowhere(d, _texts(o))


def test_a_secret_in_a_progress_message_is_cut(live: tuple[Daemon, Client]) -> None:
    d, c = live
    events = list(c.stream([Call(tool="leaky.leak", arguments={"where": "progress"})]))
    progress = [e.progress_message for e in events if e.kind is EventKind.PROGRESS]
    assert progress, events
    assert MASK in progress[0], progress
    outcome = events[-1].outcome
    assert outcome is not None
    assert outcome.status is Status.SUCCESS, outcome
    _nowhere(d, *progress, _texts(outcome))


def test_a_secret_on_stderr_of_a_crash_is_cut(live: tuple[Daemon, Client]) -> None:
    """The server prints it on stderr and exits mid-call; it is started anew after."""
    d, c = live
    o = c.run(Call(tool="leaky.leak", arguments={"where": "stderr"}))
    assert o.error_class == "interrupted", o.message
    again = c.run(Call(tool="leaky.leak", arguments={"where": "text"}))
    assert again.status is Status.SUCCESS, again.message
    providers = {p.provider: p for p in c.list_providers()}
    _nowhere(d, _texts(o), providers["mcp:leaky"].last_error)


def test_a_secret_in_a_tools_description_is_cut(live: tuple[Daemon, Client]) -> None:
    d, c = live
    specs = {t.name: t for t in c.list_tools()}
    assert MASK in specs["leaky.leak"].description, specs["leaky.leak"].description
    _nowhere(d, *(t.description for t in specs.values()))


def test_a_server_that_fails_at_start_is_quoted_without_its_secret(
    live: tuple[Daemon, Client], tmp_path: Path
) -> None:
    """FINDING (high): the stderr quoted in a start error (ListProviders' and doctor's
    last error, the daemon's log) held the value the server printed."""
    d, c = live
    nostart = {p.provider: p for p in c.list_providers()}["mcp:nostart"]
    assert "cannot start" in nostart.last_error, nostart
    assert nostart.last_error.count(MASK) == 2, nostart.last_error
    assert MASK in d.log()
    where = ("--addr", d.address, "--sandbox", "bwrap", "--state-dir", str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", "doctor", *where, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
    )
    states = {s["provider"]: s for s in json.loads(done.stdout)["mcp_servers"]}
    assert MASK in states["mcp:nostart"]["last_error"], states
    _nowhere(d, nostart.last_error, done.stdout, done.stderr)


# -- B. overrides' effects -------------------------------------------------------------


def test_a_dash_named_argument_is_a_path_the_policy_sees(live: tuple[Daemon, Client]) -> None:
    """FINDING (medium): `{file-path}` did not render (its own regex took no `-`)."""
    d, c = live
    denied = c.run(
        Call(tool="leaky.put_at", arguments={"file-path": "notes/secret.txt", "text": "x"})
    )
    assert (denied.status, denied.error_class) == (Status.REJECTED, "policy_denied"), denied
    out = c.run(Call(tool="leaky.put_at", arguments={"file-path": "../outside.txt", "text": "x"}))
    assert (out.status, out.error_class, out.field) == (
        Status.REJECTED,
        "permission_denied",
        "arguments.file-path",
    ), out.message
    ok = c.run(Call(tool="leaky.put_at", arguments={"file-path": "notes/ok.txt", "text": "fine"}))
    assert ok.status is Status.SUCCESS, ok.message
    assert (d.workspace / "notes" / "ok.txt").read_text() == "fine"
    assert (d.root / "outside.txt").read_text() == UNTOUCHED


def test_a_table_override_is_a_table_the_policy_sees(live: tuple[Daemon, Client]) -> None:
    """FINDING (medium): `read_tables` / `write_tables` of an override were dropped, so
    the policy's `tables:` rules never saw an MCP tool's tables."""
    d, c = live
    o = c.run(Call(tool="leaky.fill_table", arguments={"db": "app.db"}))
    assert (o.status, o.error_class) == (Status.REJECTED, "policy_denied"), o.message
    o = c.run(Call(tool="leaky.fill_table", arguments={"db": "../app.db"}))
    assert (o.status, o.error_class, o.field) == (
        Status.REJECTED,
        "permission_denied",
        "arguments.db",
    ), o.message
    assert not (d.workspace / "app.db").exists()


def _line_of(d: Daemon, tool: str) -> int:
    lines = (d.root / "tools.yaml").read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if re.match(rf"\s+{tool}:", line))


def test_an_override_that_does_not_fit_the_tool_leaves_it_out(
    live: tuple[Daemon, Client],
) -> None:
    """FINDING (medium): an override naming an argument the tool lacks (or a list)
    was taken as it was; it is now refused when the server lists its tools, named at
    the override's file:line, like a command tool's at load."""
    d, c = live
    names = {t.name for t in c.list_tools()}
    assert "fs.write_file" in names
    assert not {"fs.read_text_file", "fs.read_multiple_files"} & names
    tools_yaml = str(d.root / "tools.yaml")
    text_at = f"{tools_yaml}:{_line_of(d, 'read_text_file')}"
    many_at = f"{tools_yaml}:{_line_of(d, 'read_multiple_files')}"
    unknown = f"tool read_text_file left out: {text_at}: tools.read_text_file.effects.reads[0]: "
    unknown += "{nope} is not a property of the tool's inputSchema"
    array = f"tool read_multiple_files left out: {many_at}: "
    array += "tools.read_multiple_files.effects.reads[0]: {paths} is of type array"
    assert unknown in d.log(), d.log()
    assert array in d.log(), d.log()
    fs = {p.provider: p for p in c.list_providers()}["mcp:fs"]
    assert fs.last_error.startswith((unknown, array)), fs.last_error


ESCAPES = ["../outside.txt", "../../outside.txt", "notes/../../outside.txt", "/etc/eg-pwned"]


@pytest.mark.parametrize("path", ESCAPES)
def test_a_path_outside_the_workspace_is_rejected_before_the_server(
    live: tuple[Daemon, Client], path: str
) -> None:
    d, c = live
    o = c.run(Call(tool="fs.write_file", arguments={"path": path, "content": "PWNED"}))
    assert (o.status, o.error_class, o.field) == (
        Status.REJECTED,
        "permission_denied",
        "arguments.path",
    ), o.message
    assert o.mark("started") is None
    assert (d.root / "outside.txt").read_text() == UNTOUCHED
    assert not Path("/etc/eg-pwned").exists()


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        ("fs.write_file", {"path": ["..", "outside.txt"], "content": "PWNED"}, "arguments.path"),
        ("leaky.write_any", {"target": ["..", "outside.txt"]}, "arguments.target"),
        ("leaky.write_any", {"target": {"..": "outside.txt"}}, "arguments.target"),
        ("leaky.write_any", {"target": True}, "arguments.target"),
    ],
)
def test_a_list_object_or_boolean_for_a_path_is_rejected(
    live: tuple[Daemon, Client], tool: str, arguments: dict[str, Any], field: str
) -> None:
    """FINDING (medium): `write_any`'s `target` has no type, so a list passes the schema;
    its effects path was then resolved as a list (an internal error), while the server
    joins the list into `../outside.txt`."""
    d, c = live
    before = sorted(p.name for p in d.root.iterdir())
    o = c.run(Call(tool=tool, arguments=arguments))
    assert (o.status, o.error_class, o.field) == (Status.REJECTED, "invalid_argument", field), (
        o.message
    )
    assert o.mark("started") is None
    assert (d.root / "outside.txt").read_text() == UNTOUCHED
    assert sorted(p.name for p in d.root.iterdir()) == before


def test_the_same_tools_write_inside_the_workspace(live: tuple[Daemon, Client]) -> None:
    """The control: the refusals above are the daemon's, not the servers' own."""
    d, c = live
    o = c.run(Call(tool="fs.write_file", arguments={"path": "notes/a.txt", "content": "A"}))
    assert o.status is Status.SUCCESS, o.message
    o = c.run(Call(tool="leaky.write_any", arguments={"target": "notes/b.txt", "text": "B"}))
    assert o.status is Status.SUCCESS, o.message
    assert (d.workspace / "notes" / "a.txt").read_text() == "A"
    assert (d.workspace / "notes" / "b.txt").read_text() == "B"
