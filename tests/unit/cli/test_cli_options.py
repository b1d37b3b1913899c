"""The `execgate` command line itself: help with defaults, --version, a fast --help that
imports no command, a closed pipe that ends quietly."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from execgate.executor.cli import main as cli

HEAVY = ("grpc", "rich", "execgate.client", "execgate.executor.server.serve", "sqlglot", "yaml")


def _parsers(
    parser: argparse.ArgumentParser, path: str = "execgate"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def _options() -> list[tuple[str, argparse.Action]]:
    return [
        (path, action)
        for path, parser in _parsers(cli.full_parser())
        for action in parser._actions
        if action.option_strings and action.help != argparse.SUPPRESS
    ]


def test_every_option_has_help_with_its_default() -> None:
    formatter = cli.Parser().formatter_class(prog="execgate")
    missing = []
    for path, action in _options():
        shown = formatter._expand_help(action) if action.help else ""
        if not action.help:
            missing.append(f"{path} {action.option_strings[0]}: no help")
        elif action.default != argparse.SUPPRESS and not (
            "default" in shown or "required" in shown
        ):
            missing.append(f"{path} {action.option_strings[0]}: no default shown ({shown})")
    assert not missing, "\n".join(missing)
    assert len(_options()) > 80  # the walk reached every command's options


def test_help_renders_defaults() -> None:
    out = _run("calls", "list", "--help").stdout
    assert "(default: 50)" in out  # --limit
    out = _run("serve", "--help").stdout
    assert "(default: 2)" in out or "default: 2" in out  # --grace


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "COLUMNS": "80", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=full_env,
    )


def test_version() -> None:
    from importlib.metadata import version

    result = _run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"execgate {version('execgate')}"


def test_top_level_help_imports_no_command() -> None:
    probe = (
        "import sys\n"
        "from execgate.executor.cli import main as cli\n"
        "try:\n"
        "    cli.main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert "serve" in result.stdout
    assert "kills" in result.stdout
    assert result.stdout.strip().endswith("LOADED []"), result.stdout


def test_a_command_loads_only_its_module() -> None:
    probe = (
        "import sys\n"
        "from execgate.executor.cli import main as cli\n"
        "try:\n"
        "    cli.main(['policy', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('LOADED', [m for m in ('grpc', 'execgate.executor.server.serve')"
        " if m in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert "check" in result.stdout
    assert result.stdout.strip().endswith("LOADED []"), result.stdout


def test_unknown_command_is_a_usage_error() -> None:
    result = _run("nosuch")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_policy_check_and_test_json() -> None:
    from pathlib import Path

    root = Path(cli.__file__).resolve().parents[2] / "policies"
    checked = json.loads(_run("policy", "check", "--json", str(root / "default.yaml")).stdout)
    assert [(c["file"], c["ok"], c["errors"]) for c in checked] == [
        (str(root / "default.yaml"), True, [])
    ]
    bad = _run("policy", "check", "--json", str(root / "policy.schema.json"))
    assert bad.returncode == 1
    assert json.loads(bad.stdout)[0]["ok"] is False
    result = _run("policy", "test", "--json", str(root / "tests"))
    report = json.loads(result.stdout)
    assert result.returncode == 0
    assert report["failed"] == 0
    assert report["passed"] == len(report["cases"]) > 0


# Commands that print no result to parse: the daemon itself, the demo's narration, and the
# MCP bridge (its stdout is the MCP protocol).
NO_RESULT = {"execgate serve", "execgate demo", "execgate mcp"}


def test_every_command_that_prints_a_result_takes_json() -> None:
    leaves = [
        (path, parser)
        for path, parser in _parsers(cli.full_parser())
        if path != "execgate"
        and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    ]
    assert len(leaves) >= 20
    lacking = [
        path
        for path, parser in leaves
        if path not in NO_RESULT and not any("--json" in a.option_strings for a in parser._actions)
    ]
    assert not lacking, lacking


def test_token_new_json() -> None:
    result = _run("token", "new", "ana", "--role", "operator", "--json")
    data = json.loads(result.stdout)
    assert data["entry"]["name"] == "ana"
    assert data["entry"]["roles"] == ["operator"]
    import hashlib

    assert hashlib.sha256(data["token"].encode()).hexdigest() == data["entry"]["token_sha256"]


def test_a_command_run_in_process_leaves_the_callers_sigpipe_alone(tmp_path: Path) -> None:
    # Only the execgate process itself ends quietly on a closed pipe; a caller running a
    # command in-process (this test run) must keep EPIPE as an exception, not be killed by it.
    import signal

    from execgate.executor.cli.main import main

    before = signal.getsignal(signal.SIGPIPE)
    assert main(["tools", "--addr", f"unix:{tmp_path / 'none.sock'}"]) == 69
    assert signal.getsignal(signal.SIGPIPE) == before


def test_warm_sandboxes_takes_a_count_from_1_to_1024() -> None:
    parser = cli.full_parser()
    base = ["serve", "--state-dir", "/tmp/s", "--workspace", "/tmp/w"]
    assert parser.parse_args([*base, "--warm-sandboxes", "8"]).warm_sandboxes == 8
    assert parser.parse_args(base).warm_sandboxes == 64
    for bad in ("0", "1025", "many"):
        ran = subprocess.run(
            [sys.executable, "-m", "execgate.executor.cli", *base, "--warm-sandboxes", bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 2, ran.stderr
        assert "--warm-sandboxes" in ran.stderr
