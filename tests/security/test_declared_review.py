"""Security review of declared command tools (merge16): each test is the proof of one
finding, through the real daemon on a real socket and the real bwrap sandbox.

The policy denies every path under `vault/`; the agent must not read or write there
through a declared tool whose effects the policy checks."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from execgate.client import Call, Client, Outcome, Status
from execgate.executor.core.errors import ToolFileErrors
from execgate.executor.core.outcomes import ErrorClass, Evidence
from execgate.executor.tools import ToolOutput
from execgate.executor.tools.decl import CommandDecl
from execgate.executor.tools.declared import CommandTool
from execgate.executor.tools.toolfile import parse_sources
from tests.daemon import Daemon

PY = sys.executable if sys.executable.startswith("/usr/") else "python3"
VAULT = "VAULT-" + uuid.uuid4().hex
# A secret JSON escapes (a non-ASCII letter: json.dumps writes \\u00e9): the escaped
# form is not the value, so it is not cut from stdout, and parsing stdout restores it.
SECRET = "tok-é-" + uuid.uuid4().hex
STR = {"type": "string"}
READ = "import sys; print(open(sys.argv[1]).read())"
WRITE = "import sys; open(sys.argv[1], 'w').write('PWNED')"
# `n` bytes of padding, then the secret: the agent chooses where the raw cap cuts it.
PAD = "import os, sys; sys.stdout.write('x' * int(sys.argv[1]) + os.environ['TOKEN'])"
ESCAPED = "a process the sandbox could not find still held the output open"
RAW_CAP = 1024 * 1024  # Limits.raw_cap_bytes: what the tool keeps of stdout
DUMP = "import json, os; print(json.dumps({{'token': os.environ['TOKEN']}}))"


def tool(name: str, argv: list[str], props: dict[str, Any], **more: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": props, "additionalProperties": False}
    return {"name": name, "description": name, "input_schema": schema, "argv": argv, **more}


TOOLS = [
    tool("show", [PY, "-c", READ, "{path}"], {"path": STR}, effects={"reads": ["{path}"]}),
    tool(
        "save",
        [PY, "-c", WRITE, "{name}"],
        {"dir": STR, "name": STR},
        cwd="{dir}",
        effects={"writes": ["{dir}/{name}"]},
    ),
    tool(
        "pad_then_token",
        [PY, "-c", PAD, "{n}"],
        {"n": {"type": "integer"}},
        env={"secrets": {"TOKEN": "EG_REVIEW_SECRET"}},
        effects={},
    ),
    tool(
        "token_json",
        [PY, "-c", DUMP],
        {},
        env={"secrets": {"TOKEN": "EG_REVIEW_SECRET"}},
        effects={},
        output="json",
    ),
]
POLICY = {
    "version": 1,
    "default": "deny",
    "rules": [
        {"id": "vault", "effect": "deny", "paths": ["vault/**"]},
        {"id": "all", "effect": "allow", "tools": ["*"]},
    ],
}


def _review_daemon(root: Path, tools: list[dict[str, Any]], policy: dict[str, Any]) -> Daemon:
    """A started daemon serving `tools` under `policy`, the review's secret in its env."""
    (root / "tools.yaml").write_text(yaml.safe_dump({"version": 1, "tools": tools}))
    (root / "policy.yaml").write_text(yaml.safe_dump(policy))
    (root / "d").mkdir()
    tools_file, policy_file = str(root / "tools.yaml"), str(root / "policy.yaml")
    return Daemon(
        root / "d",
        "--tools",
        tools_file,
        "--policy",
        policy_file,
        env={"EG_REVIEW_SECRET": SECRET},
    ).start()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Client]]:
    d = _review_daemon(tmp_path_factory.mktemp("review"), TOOLS, POLICY)
    (d.workspace / "vault").mkdir(exist_ok=True)
    (d.workspace / "sub").mkdir(exist_ok=True)
    try:
        with Client(d.address) as c:
            yield d, c
    finally:
        d.stop()


@pytest.fixture(autouse=True)
def vault(live: tuple[Daemon, Client]) -> None:
    """The vault's key as it should stay, before each test."""
    (live[0].workspace / "vault" / "key").write_text(VAULT)


def test_the_vault_is_denied_to_a_direct_call(live: tuple[Daemon, Client]) -> None:
    """The baseline the findings below get around: the policy does see effects paths."""
    _, c = live
    o = c.run(Call(tool="show", arguments={"path": "vault/key"}))
    assert (o.status, o.error_class) == (Status.REJECTED, "policy_denied"), o.message


def test_a_symlink_made_after_validation_is_followed_at_run(
    live: tuple[Daemon, Client],
) -> None:
    """FINDING (high): the effects path is checked at validation, but the command gets
    the raw argument and follows whatever it names when it runs. Call 0 of a batch makes
    `link` -> vault/key; call 1, validated when `link` did not exist, reads the vault."""
    _d, c = live
    link = "link-" + uuid.uuid4().hex[:8]
    make = f"import os, time; time.sleep(0.5); os.symlink('vault/key', {link!r})"
    calls = [
        Call(tool="run_command", arguments={"argv": [PY, "-c", make]}),
        Call(tool="show", arguments={"path": link}),
    ]
    first, second = c.execute(calls)
    assert first.status is Status.SUCCESS, first.message
    assert VAULT not in second.text, "a declared tool read a path the policy denies"
    # Validated before `link` existed (else policy_denied): refused when it starts.
    assert (second.status, second.error_class, second.field) == (
        Status.FAILURE,
        "permission_denied",
        "arguments.path",
    ), second.message


def test_an_absolute_piece_of_a_joined_template_escapes_the_checked_path(
    live: tuple[Daemon, Client],
) -> None:
    """FINDING (high): `writes: ["{dir}/{name}"]` with `cwd: "{dir}"` and argv `{name}`:
    an absolute `name` makes the checked path `sub//abs/...` (inside the workspace,
    outside the vault) while the command writes the absolute path itself."""
    d, c = live
    target = d.workspace / "vault" / "key"
    o = c.run(Call(tool="save", arguments={"dir": "sub", "name": str(target)}))
    assert target.read_text() == VAULT, "the vault was written through a declared tool"
    assert o.status is Status.REJECTED, (o.status, o.message)
    assert o.field == "arguments.name"


def test_an_absent_piece_of_a_joined_template_drops_the_check(
    live: tuple[Daemon, Client],
) -> None:
    """FINDING (high): an optional argument left out drops the whole effect
    (`{dir}/{name}` without `dir`), so `name` reaches the command unchecked."""
    d, c = live
    target = d.workspace / "vault" / "key"
    o = c.run(Call(tool="save", arguments={"name": "vault/key"}))
    assert target.read_text() == VAULT, "the vault was written through a declared tool"
    assert o.status is Status.REJECTED, (o.status, o.message)


def test_a_secret_json_escapes_is_not_in_the_structured_result(
    live: tuple[Daemon, Client],
) -> None:
    """FINDING (medium): `output: json` parses stdout after the secret was cut from its
    text; a secret JSON escapes (quote, backslash, non-ASCII) is not found in the text and
    comes back whole in `structured`."""
    d, c = live
    o = c.run(Call(tool="token_json", arguments={}))
    assert o.status is Status.SUCCESS, o.message
    assert SECRET not in o.structured.values()
    assert SECRET not in o.text
    assert SECRET not in o.message
    journal = b"".join(p.read_bytes() for p in d.state_dir.rglob("*") if p.is_file())
    assert SECRET.encode() not in journal
    assert SECRET not in d.log()


# -- the process backend a tools file may ask for -------------------------------------

HOLD = (
    "import os, time\n"
    "t = time.monotonic()\n"
    "while not os.path.exists('go') and time.monotonic() - t < 60: time.sleep(0.02)\n"
)
# Another call, as the agent writes it: every environment it may read, until the secret.
SNOOP = (
    "import glob, os, time\n"
    "t, seen = time.monotonic(), ''\n"
    "while 'TOKEN=' not in seen and time.monotonic() - t < 30:\n"
    "    for p in glob.glob('/proc/[0-9]*/environ'):\n"
    "        try: e = open(p, 'rb').read().decode('utf-8', 'replace')\n"
    "        except OSError: continue\n"
    "        if 'TOKEN=' in e: seen = e\n"
    "open('go', 'w').close()\n"
    "print(seen.replace(chr(0), ' '))\n"
)
PROCESS_TOOLS = [
    tool(
        "ifaces_process",
        [PY, "-c", "import socket; print([n for _, n in socket.if_nameindex()])"],
        {},
        effects={"net": ["example.com"]},
        sandbox={"backend": "process"},
    ),
    tool(
        "ro_process",
        [PY, "-c", "open('written-by-a-reader', 'w').write('x')"],
        {},
        effects={"reads": ["."]},
        sandbox={"backend": "process"},
    ),
    tool(
        "hold_secret",
        [PY, "-c", HOLD],
        {},
        env={"secrets": {"TOKEN": "EG_REVIEW_SECRET"}},
        effects={},
        sandbox={"backend": "process"},
    ),
]
PROCESS_POLICY = {
    "version": 1,
    "default": "deny",
    "rules": [{"id": "all", "effect": "allow", "tools": ["*"]}],
    "sandbox": [
        {"tools": ["run_command"], "backend": "process"},
        {"tools": ["ifaces_process"], "network": False},
    ],
}


@pytest.fixture(scope="module")
def process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Client]]:
    d = _review_daemon(tmp_path_factory.mktemp("review-process"), PROCESS_TOOLS, PROCESS_POLICY)
    try:
        with Client(d.address) as c:
            yield d, c
    finally:
        d.stop()


def _refused_as_weaker(o: Outcome) -> None:
    assert (o.status, o.error_class) == (Status.FAILURE, "sandbox_error"), o.message
    assert "weaker than bwrap" in o.message, o.message


def test_a_reader_asking_for_process_is_refused(process: tuple[Daemon, Client]) -> None:
    """FINDING (medium, fixed): the process backend binds nothing read-only, so a tools
    file's `sandbox.backend: process` let a declared reader write. A declaration may no
    longer loosen the daemon's or the policy's backend: the call is refused, nothing ran."""
    d, c = process
    o = c.run(Call(tool="ro_process", arguments={}))
    assert not (d.workspace / "written-by-a-reader").exists(), "a declared reader wrote"
    _refused_as_weaker(o)


def test_a_tools_file_asking_for_process_gets_no_network(
    process: tuple[Daemon, Client],
) -> None:
    """FINDING (medium, fixed): the declared `process` backend won over the daemon's bwrap
    and had the host's network although the policy's rule says `network: false`."""
    _, c = process
    _refused_as_weaker(c.run(Call(tool="ifaces_process", arguments={})))


def test_a_secret_is_not_in_another_calls_reach(process: tuple[Daemon, Client]) -> None:
    """FINDING (medium, fixed for tools files): under the process backend every call runs
    as one user, so another call could read a declared tool's secret from /proc. A tools
    file can no longer choose process; a policy rule or `--sandbox process` that does is
    documented as giving up this isolation (docs/tools.md)."""
    _, c = process
    calls = [
        Call(tool="hold_secret", arguments={}),
        Call(tool="run_command", arguments={"argv": [PY, "-c", SNOOP]}),
    ]
    held, snooped = c.execute(calls)
    _refused_as_weaker(held)
    assert SECRET not in snooped.text, "another call read the secret from /proc"


# -- the program ----------------------------------------------------------------------


@pytest.mark.parametrize("program", ["{p}", "./scripts/{p}", "{p}.sh"])
def test_the_program_holds_no_placeholder(program: str) -> None:
    """FINDING (medium, fixed): argv[0] took placeholders, so an argument chose the
    program (`./scripts/{p}` with p `../../usr/bin/python3`), and an optional one left
    out made argv[1] the program."""
    text = yaml.safe_dump(
        {"version": 1, "tools": [tool("t", [program, "x"], {"p": STR}, effects={})]}
    )
    with pytest.raises(ToolFileErrors) as info:
        parse_sources([("t.yaml", text)])
    assert "tools[0].argv[0]: the program cannot hold a placeholder" in str(info.value)


def test_a_secret_cut_by_the_raw_cap_is_not_kept_in_part(
    live: tuple[Daemon, Client],
) -> None:
    """FINDING (low): the raw cap cuts stdout mid-secret, so no whole occurrence is
    found to redact and all of the secret but its last character is journaled with the
    raw output (the agent picks the cut through an argument)."""
    d, c = live
    keep = SECRET.encode()[:-1]
    o = c.run(Call(tool="pad_then_token", arguments={"n": RAW_CAP - len(keep)}))
    assert o.status is Status.PARTIAL, o.message  # over the (64 KiB) result cap
    journal = b"".join(p.read_bytes() for p in d.state_dir.rglob("*") if p.is_file())
    assert b"x" * 1000 in journal, "the raw output is journaled (else this proves nothing)"
    assert keep not in journal


def test_a_hard_link_to_an_outside_file_is_refused(live: tuple[Daemon, Client]) -> None:
    """FINDING (medium, fixed): the built-ins treat a regular file with several hard
    links as outside the workspace (tests/security/test_hard_links.py); a declared
    tool's effects path did not, so a planted link read the outside file."""
    d, c = live
    outside = d.root / ("outside-" + uuid.uuid4().hex)
    outside.write_text(VAULT)
    name = "planted-" + uuid.uuid4().hex[:8]
    os.link(outside, d.workspace / name)
    o = c.run(Call(tool="show", arguments={"path": name}))
    assert VAULT not in o.text, "a declared tool read a file outside the workspace"
    assert (o.error_class, o.field) == ("permission_denied", "arguments.path"), o.message


@pytest.mark.parametrize(
    ("code", "message"), [(0, ESCAPED), (1, f"exited with status 1; {ESCAPED}")]
)
def test_a_success_code_keeps_the_escape_warning(code: int, message: str) -> None:
    """FINDING (low, fixed): a success code cleared the whole message, so "a process the
    sandbox could not find still held the output open" (command._output: survivors
    unverified) vanished from the outcome of a declared tool."""
    decl = CommandDecl(
        name="t", description="d", input_schema={"type": "object"}, argv=("true",),
        success_codes=(0, 1),
    )  # fmt: skip
    error = ErrorClass.NONE if code == 0 else ErrorClass.NONZERO_EXIT
    out = ToolOutput(evidence=Evidence(exit_code=code), error_class=error, message=message)
    judged = CommandTool(decl, environ={})._judged(out)
    assert judged.error_class is ErrorClass.NONE
    assert ESCAPED in judged.message
