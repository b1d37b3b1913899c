"""The one glob syntax of policies (docs/policy.md, "Glob syntax"): the documented
examples hold, for every matcher that takes globs, in the engine and through a daemon.

The examples are read from the docs' table itself, so the docs cannot drift from the
matcher. Each row is checked as a path glob and, where the name has no `/`, as a
`tools`, `tables`, `hosts` and `agents` glob too: one syntax for all of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Call, Client, Status
from execgate.executor.cli.main import main
from execgate.executor.policy import Effect, PolicyInput, Rule, parse_policy, path_glob
from tests.daemon import Daemon

DOCS = Path(__file__).resolve().parents[2] / "docs" / "policy.md"
_ROW = re.compile(r"^\| `(?P<pattern>[^`]+)` \| `(?P<name>[^`]+)` \| (?P<verdict>yes|no) \|$")


def _documented() -> list[tuple[str, str, bool]]:
    text = DOCS.read_text()
    table = text.split("<!-- glob-examples -->", 1)[1].split("<!-- /glob-examples -->", 1)[0]
    rows = [m for line in table.splitlines() if (m := _ROW.match(line.strip()))]
    return [(m["pattern"], m["name"], m["verdict"] == "yes") for m in rows]


EXAMPLES = _documented()


def test_the_docs_table_is_read() -> None:
    # Guards the parser: a table that stopped parsing would make the cases below vacuous.
    assert len(EXAMPLES) >= 20
    assert {verdict for _, _, verdict in EXAMPLES} == {True, False}


@pytest.mark.parametrize(("pattern", "name", "expected"), EXAMPLES)
def test_documented_path_glob(pattern: str, name: str, expected: bool) -> None:
    assert path_glob(name, pattern) is expected


NAME_EXAMPLES = [e for e in EXAMPLES if "/" not in e[0] and "/" not in e[1]]


@pytest.mark.parametrize(("pattern", "name", "expected"), NAME_EXAMPLES)
def test_tools_tables_hosts_agents_use_the_same_syntax(
    pattern: str, name: str, expected: bool
) -> None:
    for field in ("tools", "tables", "hosts", "agents"):
        rule = Rule(id="r", effect=Effect.DENY, **{field: (pattern,)})
        call = PolicyInput(
            tool=name if field == "tools" else "t",
            agent=name if field == "agents" else "local",
            tables=(name,) if field == "tables" else (),
            hosts=(name,) if field == "hosts" else (),
        )
        assert rule.matches(call) is expected, field


def test_sandbox_and_limits_scopes_use_the_same_syntax() -> None:
    policy = parse_policy(
        "version: 1\nrules: []\n"
        "sandbox:\n  - {tools: ['run_[a-c]*'], backend: process}\n"
        "limits:\n  - {tools: ['run_[a-c]*'], timeout_s: 5}\n",
        "scopes.yaml",
    )
    assert policy.sandbox_for("run_command") is not None
    assert policy.sandbox_for("run_x") is None
    assert policy.limits_for(PolicyInput(tool="run_command")).timeout == 5
    assert policy.limits_for(PolicyInput(tool="run_x")).timeout is None


POLICY = """\
version: 1
default: deny
rules:
  - id: numbered-notes
    effect: deny
    paths: ["notes/[0-9]*.md"]
    reason: numbered notes are drafts
    examples:
      match: [{tool: read_file, paths: [notes/1-draft.md]}]
      not_match: [{tool: read_file, paths: [notes/a.md]}]
  - id: reads
    effect: allow
    tools: ["read_*", "list_[dD]ir"]
"""


def test_explain_cli_uses_the_syntax(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY)
    assert main(["policy", "check", str(policy)]) == 0
    capsys.readouterr()
    main(
        [
            "policy",
            "explain",
            "--policy",
            str(policy),
            "--tool",
            "read_file",
            "--path",
            "notes/2.md",
        ]
    )
    assert "decision: deny (numbered-notes)" in capsys.readouterr().out
    assert (
        main(
            [
                "policy",
                "explain",
                "--policy",
                str(policy),
                "--tool",
                "read_file",
                "--path",
                "notes/b.md",
            ]
        )
        == 0
    )
    assert "decision: allow (reads)" in capsys.readouterr().out


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    root = tmp_path_factory.mktemp("globs")
    (root / "policy.yaml").write_text(POLICY)
    notes = root / "workspace" / "notes"
    notes.mkdir(parents=True)
    (notes / "1.md").write_text("draft\n")
    (notes / "a.md").write_text("final\n")
    daemon = Daemon(root, "--policy", str(root / "policy.yaml")).start()
    try:
        with Client(daemon.address) as client:
            yield client
    finally:
        daemon.stop()


def test_daemon_decides_with_the_syntax(gate: Client) -> None:
    out = gate.run(Call(tool="read_file", arguments={"path": "notes/1.md"}))
    assert (out.status, out.error_class) == (Status.REJECTED, "policy_denied"), out
    assert "numbered-notes" in out.message
    out = gate.run(Call(tool="read_file", arguments={"path": "notes/a.md"}))
    assert out.status is Status.SUCCESS, out
    assert "final" in out.text
