"""The policy file's one source of truth is its JSON Schema (policies/policy.schema.json):
the loader validates every file with it, every error at file:line:column, all of them.

`execgate policy check` and the daemon (at start and on reload) report every error in a
file, in file order, not only the first. The shipped policies name the schema for editors.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from execgate.executor.cli.main import main
from execgate.executor.core.errors import PolicyError
from execgate.executor.policy import parse_policy
from tests.daemon import Daemon

POLICIES = Path(__file__).resolve().parents[2] / "policies"

# Five independent mistakes, one per line marked with its column.
MANY = """\
version: 1
default: maybe
colour: red
rules:
  - id: a
    effect: allow
    tools: [x]
    tool: [y]
  - id: b
    effect: deny
    tools: read_file
  - {id: c, effect: allow, tools: [y], ttl: 3}
limits:
  - {tools: [x], timeout_s: -1}
"""
MANY_ERRORS = [
    (2, 10, "default: must be allow or deny, not 'maybe'"),
    (3, 1, "file: unknown key 'colour'"),
    (8, 5, "rules[0]: unknown key 'tool'"),
    (11, 12, "rules[1].tools: must be a list of non-empty strings"),
    (12, 45, "rules[2].ttl: only an ask rule has ttl"),
    (14, 29, "limits[0].timeout_s: must be a positive number"),
]


def _errors(text: str) -> list[PolicyError]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    return list(getattr(info.value, "errors", [info.value]))


def test_every_error_is_reported_in_file_order() -> None:
    errors = _errors(MANY)
    got = [(e.line, e.column) for e in errors]
    assert got == [(line, col) for line, col, _ in MANY_ERRORS], [str(e) for e in errors]
    for err, (line, col, says) in zip(errors, MANY_ERRORS, strict=True):
        assert str(err).startswith(f"p.yaml:{line}:{col}: {says}"), str(err)


def test_check_prints_every_error_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(MANY)
    code = main(["policy", "check", str(bad)])
    out = capsys.readouterr().out
    assert code == 1
    for line, col, says in MANY_ERRORS:
        assert f"FAIL {bad}:{line}:{col}: {says}" in out, out
    assert out.count("FAIL ") == len(MANY_ERRORS)
    assert f"{bad}: {len(MANY_ERRORS)} errors" in out


def test_errors_the_schema_cannot_see_are_all_reported_too() -> None:
    # Duplicate keys, reused ids, bad regexes and failing examples are the loader's: each
    # rule's first one is reported, for every rule.
    text = (
        "version: 1\n"
        "rules:\n"
        "  - {id: a, effect: deny, tools: [x]}\n"
        "  - {id: a, effect: deny, tools: [y]}\n"
        "  - id: r\n"
        "    effect: deny\n"
        "    when: [{arg: x, matches: '('}]\n"
        "  - id: env\n"
        "    effect: deny\n"
        "    paths: ['**/.env']\n"
        "    examples: {match: [{tool: t, paths: [env.py]}]}\n"
    )
    errors = _errors(text)
    says = [str(e) for e in errors]
    assert [(e.line, e.column) for e in errors] == [(4, 5), (7, 30), (11, 24)], says
    assert "rules[1].id: 'a' is used twice" in says[0]
    assert "rules[2].when[0].matches: not a regex" in says[1]
    assert "rules[3].examples.match[0]: rule 'env' does not match" in says[2]


def test_schema_messages_come_from_the_schema_file() -> None:
    # The words of a schema error are the schema's (x-messages), so editors and the
    # loader say the same thing.
    schema = json.loads((POLICIES / "policy.schema.json").read_text())
    message = schema["$defs"]["rule"]["x-messages"]["anyOf"]
    [err] = _errors("version: 1\nrules:\n  - {id: a, effect: deny, reason: r}\n")
    assert (err.line, err.column) == (3, 5)
    assert f"rules[0]: {message}" in str(err)


def test_a_schema_error_nested_in_a_list_points_at_its_item() -> None:
    [err] = _errors("version: 1\nrules:\n  - id: a\n    effect: deny\n    tools: [x, '']\n")
    assert (err.line, err.column) == (5, 16), str(err)
    assert "rules[0].tools[1]: must be a non-empty string" in str(err)


def test_a_non_mapping_file_is_one_error() -> None:
    [err] = _errors("- a\n- b\n")
    assert "file: must be a mapping" in str(err)


SCHEMA_LINE = re.compile(r"^# yaml-language-server: \$schema=(?P<ref>\S+)$", re.M)


@pytest.mark.parametrize(
    "policy",
    [POLICIES / "default.yaml", *sorted((POLICIES / "examples").glob("*.yaml"))],
    ids=lambda p: p.name,
)
def test_shipped_policies_name_their_schema_for_editors(policy: Path) -> None:
    first = policy.read_text().splitlines()[0]
    match = SCHEMA_LINE.match(first)
    assert match, f"{policy}: first line {first!r}"
    assert (policy.parent / match["ref"]).resolve() == (POLICIES / "policy.schema.json")


def test_daemon_refuses_to_start_listing_every_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(MANY)
    proc = subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", "serve", "--policy", str(bad),
         "--workspace", str(tmp_path / "ws"), "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    for line, col, says in MANY_ERRORS:
        assert f"{bad}:{line}:{col}: {says}" in proc.stderr, proc.stderr


def test_daemon_refuses_a_bad_reload_and_journals_every_error(tmp_path: Path) -> None:
    from execgate.client import Client
    from tests.support import wait_until

    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nrules:\n  - {id: all, effect: allow, tools: ['*']}\n")
    daemon = Daemon(tmp_path, "--policy", str(policy)).start()
    try:
        policy.write_text(MANY)
        wait_until(lambda: "limits[0].timeout_s" in daemon.log(), "the refused reload logged")
        log = daemon.log()
        for line, col, says in MANY_ERRORS:
            assert f"{line}:{col}: {says}" in log, log
        with Client(daemon.address) as client:
            assert client.list_tools()  # still serving, on the last good policy
    finally:
        daemon.stop()
