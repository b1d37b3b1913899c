"""The `execgate` console script against a real daemon (and against none)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client, Status
from tests.daemon import Daemon

CONSOLE_SCRIPT = Path(sys.executable).with_name("execgate")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the whole module (each CLI run is a process start already);
    tests keep apart by call ids and run ids."""
    d = Daemon(tmp_path_factory.mktemp("cli")).start()
    yield d
    if d.proc is not None and d.proc.poll() is None:
        d.stop()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.address) as c:
        yield c


def execgate(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, script: bool = False
) -> subprocess.CompletedProcess[str]:
    cmd = [str(CONSOLE_SCRIPT)] if script else [sys.executable, "-m", "execgate.executor.cli"]
    full_env = {k: v for k, v in os.environ.items() if k != "EXECGATE_ADDR"}
    full_env.update({"COLUMNS": "200", "NO_COLOR": "1", **(env or {})})
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=60, env=full_env, cwd=cwd
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout


def test_console_script_is_installed(daemon: Daemon) -> None:
    assert CONSOLE_SCRIPT.exists() or shutil.which("execgate")
    out = ok(execgate("health", "--addr", daemon.address, script=CONSOLE_SCRIPT.exists()))
    assert out.strip() == "SERVING"


def test_tools(daemon: Daemon) -> None:
    out = ok(execgate("tools", "--addr", daemon.address))
    for name in (
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "search",
        "run_command",
        "noop",
    ):
        assert name in out


def test_tools_json(daemon: Daemon) -> None:
    tools = json.loads(ok(execgate("tools", "--json", "--addr", daemon.address)))
    by_name = {t["name"]: t for t in tools}
    assert {"read_file", "write_file", "run_command", "noop"} <= set(by_name)
    assert by_name["read_file"]["read_only"] is True
    assert by_name["run_command"]["read_only"] is False
    assert by_name["run_command"]["destructive"] is True
    assert by_name["read_file"]["input_schema"]["required"] == ["path"]


def test_call_prints_the_content(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("hello from a file\n")
    out = ok(execgate("call", "read_file", "--arg", "path=a.txt", "--addr", daemon.address))
    assert "SUCCESS" in out
    assert "hello from a file" in out


def test_call_json(daemon: Daemon, client: Client) -> None:
    (daemon.workspace / "a.txt").write_text("one\ntwo\nthree\n")
    out = ok(
        execgate(
            "call",
            "read_file",
            "--arg",
            "path=a.txt",
            "--arg",
            "offset=2",
            "--call-id",
            "cli-1",
            "--json",
            "--addr",
            daemon.address,
        )
    )
    data = json.loads(out)
    assert data["status"] == "success"
    assert data["error_class"] == "none"
    assert data["call_id"] == "cli-1"
    assert data["text"] == "two\nthree\n"  # offset=2 was sent as a JSON integer
    assert data["structured"]["start_line"] == 2
    rec = client.get_call("cli-1")
    assert rec.outcome is not None
    assert rec.outcome.status is Status.SUCCESS


def test_call_with_args_json(daemon: Daemon) -> None:
    out = ok(
        execgate(
            "call",
            "write_file",
            "--args-json",
            '{"path": "n.txt", "content": "42"}',
            "--json",
            "--addr",
            daemon.address,
        )
    )
    assert json.loads(out)["status"] == "success"
    # "42" for a string-typed argument stays a string, even via --arg.
    ok(
        execgate(
            "call",
            "write_file",
            "--arg",
            "path=m.txt",
            "--arg",
            "content=42",
            "--addr",
            daemon.address,
        )
    )
    assert (daemon.workspace / "n.txt").read_text() == "42"
    assert (daemon.workspace / "m.txt").read_text() == "42"


def test_failing_call_exits_1(daemon: Daemon) -> None:
    result = execgate("call", "read_file", "--arg", "path=missing.txt", "--addr", daemon.address)
    assert result.returncode == 1
    assert "FAILURE" in result.stdout
    assert "not_found" in result.stdout
    assert "Traceback" not in result.stderr
    result = execgate(
        "call", "read_file", "--arg", "path=missing.txt", "--json", "--addr", daemon.address
    )
    assert result.returncode == 1
    assert json.loads(result.stdout)["error_class"] == "not_found"


def test_rejected_call_exits_1(daemon: Daemon) -> None:
    result = execgate("call", "read_file", "--arg", "bogus=1", "--json", "--addr", daemon.address)
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["status"] == "rejected"
    assert data["error_class"] == "invalid_argument"


def test_calls_list_and_show(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("x\n")
    run = ["--run", "cli-listing"]
    ok(
        execgate(
            "call",
            "read_file",
            "--arg",
            "path=a.txt",
            "--call-id",
            "shown",
            *run,
            "--addr",
            daemon.address,
        )
    )
    ok(
        execgate(
            "call",
            "noop",
            "--arg",
            "echo=hi",
            "--call-id",
            "latest",
            *run,
            "--addr",
            daemon.address,
        )
    )

    records = json.loads(ok(execgate("calls", "list", "--json", *run, "--addr", daemon.address)))
    assert [r["call_id"] for r in records] == ["latest", "shown"]
    assert records[1]["tool"] == "read_file"
    assert records[1]["run_id"] == "cli-listing"
    assert records[1]["outcome"]["status"] == "success"
    filtered = json.loads(
        ok(
            execgate(
                "calls",
                "list",
                "--json",
                "--tool",
                "noop",
                *run,
                "--status",
                "success",
                "--addr",
                daemon.address,
            )
        )
    )
    assert [r["call_id"] for r in filtered] == ["latest"]
    table = ok(execgate("calls", "list", *run, "--addr", daemon.address))
    assert "shown" in table
    assert "latest" in table

    shown = ok(execgate("calls", "show", "shown", *run, "--addr", daemon.address))
    assert "shown" in shown
    assert "read_file" in shown
    assert "SUCCESS" in shown
    data = json.loads(
        ok(execgate("calls", "show", "shown", "--json", "--raw", *run, "--addr", daemon.address))
    )
    assert data["call_id"] == "shown"
    assert data["outcome"]["status"] == "success"
    assert json.loads(data["raw_result"])["text"] == "x\n"


def test_calls_show_unknown_call(daemon: Daemon) -> None:
    result = execgate("calls", "show", "nope", "--addr", daemon.address)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "nope" in result.stderr


def test_health(daemon: Daemon) -> None:
    assert ok(execgate("health", "--addr", daemon.address)).strip() == "SERVING"


def test_address_from_the_environment(daemon: Daemon) -> None:
    env = {"EXECGATE_ADDR": daemon.address}
    assert ok(execgate("health", env=env)).strip() == "SERVING"
    (daemon.workspace / "e.txt").write_text("via env\n")
    data = json.loads(ok(execgate("call", "read_file", "--arg", "path=e.txt", "--json", env=env)))
    assert data["text"] == "via env\n"
    listed = json.loads(ok(execgate("calls", "list", "--json", env=env)))
    assert data["call_id"] in [r["call_id"] for r in listed]


def test_relative_unix_address_is_resolved_against_the_cwd(daemon: Daemon) -> None:
    rel = os.path.relpath(daemon.socket, daemon.root)
    out = ok(execgate("health", "--addr", f"unix:{rel}", cwd=daemon.root))
    assert out.strip() == "SERVING"


NO_DAEMON_CASES = [
    (["tools"], "flag"),
    (["tools", "--json"], "env"),
    (["call", "read_file", "--arg", "path=a.txt"], "flag"),
    (["call", "noop", "--json"], "env"),
    (["calls", "list"], "flag"),
    (["calls", "show", "some-call"], "flag"),
    (["cancel", "--call", "some-call"], "flag"),
    (["health"], "flag"),
    (["health"], "env"),
]


@pytest.mark.parametrize(("command", "via"), NO_DAEMON_CASES)
def test_no_daemon_is_one_clear_line_and_exit_69(
    tmp_path: Path, command: list[str], via: str
) -> None:
    address = f"unix:{tmp_path / 'nobody-here.sock'}"
    if via == "flag":
        result = execgate(*command, "--addr", address)
    else:
        result = execgate(*command, env={"EXECGATE_ADDR": address})
    assert result.returncode == 69, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert address in lines[0]
    assert "make run" in lines[0]
    assert result.stdout == ""


def test_stale_socket_is_no_daemon_too(tmp_path: Path) -> None:
    dead = Daemon(tmp_path).start()
    dead.kill()
    assert dead.socket.exists()
    result = execgate("health", "--addr", dead.address)
    assert result.returncode == 69
    assert len(result.stderr.strip().splitlines()) == 1
    assert dead.address in result.stderr
    assert "make run" in result.stderr
