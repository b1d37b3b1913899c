"""`execgate policy check | explain | test`, and the JSON Schema shipped for editors."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from execgate.executor.cli.main import main
from execgate.executor.policy import default_policy_path

POLICIES = Path(__file__).resolve().parents[3] / "policies"
SCHEMA = json.loads((POLICIES / "policy.schema.json").read_text())


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["policy", *argv])
    return code, capsys.readouterr().out


def test_check_accepts_the_shipped_and_example_policies(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(default_policy_path()), *map(str, sorted((POLICIES / "examples").glob("*.yaml")))]
    code, out = run(capsys, "check", *files)
    assert code == 0, out
    assert out.count("ok   ") == len(files)


def test_check_names_file_line_column_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\nrules:\n  - id: r\n    effect: allow\n    tools: [x]\n    colour: red\n"
    )
    code, out = run(capsys, "check", str(default_policy_path()), str(bad))
    assert code == 1
    assert f"FAIL {bad}:6:5: rules[0]: unknown key 'colour'" in out
    assert "ok   " in out  # the good file is still reported


def test_check_refuses_a_file_whose_example_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "ex.yaml"
    bad.write_text(
        "version: 1\n"
        "rules:\n"
        "  - id: src-only\n"
        "    effect: allow\n"
        "    paths: [src/]\n"
        "    examples:\n"
        "      match:\n"
        "        - {tool: write_file, paths: [lib/x.py]}\n"
    )
    code, out = run(capsys, "check", str(bad))
    assert code == 1
    assert ":8:11: rules[0].examples.match[0]: rule 'src-only' does not match" in out


def test_explain_says_why_each_rule_did_or_did_not_match(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shipped = ("explain", "--policy", str(default_policy_path()))
    code, out = run(capsys, *shipped, "--tool", "read_file", "--path", "config/../.env")
    assert code == 1  # a deny exits 1 (docs/policy.md)
    assert out.splitlines()[0].startswith("decision: deny (secrets)")
    assert "  secrets (deny) matches" in out
    assert "  workspace-writes (allow) does not match: tools" in out
    code, out = run(capsys, *shipped, "--tool", "run_command", "--arg", 'argv=["ls"]', "--json")
    assert code == 0
    decision = json.loads(out)
    assert decision["effect"] == "allow"
    assert decision["rules"] == ["workspace-commands"]
    by_id = {r["id"]: r for r in decision["each_rule"]}
    assert by_id["secrets"]["not_matched_by"] == ["paths"]  # no paths: a paths rule cannot match


def test_policy_test_runs_cases_and_fails_on_a_wrong_expectation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run(capsys, "test", str(POLICIES / "tests"))
    assert code == 0, out
    assert " 0 failed" in out
    wrong = tmp_path / "wrong_test.yaml"
    wrong.write_text(
        yaml.safe_dump(
            {
                "policy": str(default_policy_path()),
                "cases": [
                    {
                        "name": "env readable?",
                        "input": {"tool": "read_file", "paths": [".env"]},
                        "expect": "allow",
                    },
                    {
                        "name": "src readable",
                        "input": {"tool": "read_file", "paths": ["a.py"]},
                        "expect": "allow",
                        "rules": ["workspace-reads"],
                    },
                ],
            }
        )
    )
    code, out = run(capsys, "test", str(tmp_path))
    assert code == 1
    assert "FAIL env readable?: expected allow, got deny (secrets)" in out
    assert "ok   src readable: allow" in out
    assert "1 passed, 1 failed" in out


@pytest.mark.parametrize(
    "path",
    [default_policy_path(), *sorted((POLICIES / "examples").glob("*.yaml"))],
    ids=lambda p: p.name,
)
def test_the_schema_accepts_what_the_loader_accepts(path: Path) -> None:
    jsonschema.validate(yaml.safe_load(path.read_text()), SCHEMA)


@pytest.mark.parametrize(
    "doc",
    [
        {"version": 1, "rules": [{"id": "a", "effect": "maybe", "tools": ["x"]}]},
        {"version": 1, "rules": [{"id": "a", "effect": "allow"}]},  # no matcher
        {"version": 1, "colour": "red"},
        {"version": 2},
    ],
)
def test_the_schema_refuses_what_the_loader_refuses(doc: dict[str, object]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)
