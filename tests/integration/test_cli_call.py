"""`execgate call` tells on stderr what the call is doing while it waits, and names the
call to reconcile when the daemon dies under it (real daemon, real CLI, 80 columns)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Call, Client, Status
from tests.daemon import Daemon
from tests.loop_support import ASK_POLICY, TOKENS, as_, start_auth_daemon, stop
from tests.support import Streamer, wait_until


def cli(address: str, *args: str, who: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "execgate.executor.cli", *args, "--addr", address]
    return cmd + (["--token", TOKENS[who]] if who else [])


def env() -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if k not in ("EXECGATE_ADDR", "EXECGATE_TOKEN")}
    return {**full, "COLUMNS": "80", "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_auth_daemon(tmp_path_factory.mktemp("cli-call"), ASK_POLICY)
    yield d
    stop(d)


def test_a_call_queued_behind_another_says_behind_which(daemon: Daemon, tmp_path: Path) -> None:
    # The holder keeps the workspace until the test releases it, once the second call has
    # said it is queued: no race against how long a CLI takes to start on a busy machine.
    release = daemon.workspace / "release-holder"
    wait_for_release = f"while [ ! -e {release.name} ]; do sleep 0.02; done"
    holder = Streamer(
        daemon.address,
        [
            Call(
                tool="run_command",
                arguments={"argv": ["sh", "-c", wait_for_release]},
                call_id="holder",
            )
        ],
        token=TOKENS["bot"],
        run_id="lock-run",
    )
    with as_(daemon, "bot") as bot:
        wait_until(lambda: any(r.running for r in bot.list_calls(run_id="lock-run")), "holder")
    args = ["call", "run_command", "--args-json", '{"argv": ["sleep", "0"]}', "--run", "lock-run"]
    stderr_path = tmp_path / "second.stderr"
    with open(stderr_path, "w") as stderr:
        second = subprocess.Popen(
            cli(daemon.address, *args, "--call-id", "second", who="bot"),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env(),
        )
    try:
        wait_until(lambda: "queued behind" in stderr_path.read_text(), "second call queued")
    except BaseException:
        second.kill()
        raise
    finally:
        release.touch()
    stdout, _ = second.communicate(timeout=60)
    holder.join()
    err = stderr_path.read_text()
    assert second.returncode == 0, err
    assert re.search(r"^execgate: second: queued behind lock-run/holder", err, re.M), err
    assert stdout.startswith("SUCCESS  run lock-run  call second")


def test_a_parked_call_names_its_approval_and_who_can_decide(daemon: Daemon) -> None:
    args = ["call", "run_command", "--args-json", '{"argv": ["touch", "x.txt"]}']
    proc = subprocess.Popen(
        cli(daemon.address, *args, "--run", "ask-run", who="bot"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    with as_(daemon, "alice") as alice:
        wait_until(lambda: alice.approvals_pending(), "the parked call")
        [pending] = alice.approvals_pending()
        alice.approve(pending.approval_id, "ok")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"waiting for approval {pending.approval_id}" in err
    assert "who can decide: approver" in err
    assert f"execgate approvals approve {pending.approval_id}" in err
    assert out.startswith(f"SUCCESS  run ask-run  call {pending.call_id}")


def test_a_long_call_says_how_long_it_has_been_running(daemon: Daemon) -> None:
    args = ["call", "run_command", "--args-json", '{"argv": ["sleep", "1.2"]}']
    result = subprocess.run(
        cli(daemon.address, *args, "--progress-every", "0.5", "--call-id", "slow", who="bot"),
        capture_output=True,
        text=True,
        timeout=60,
        env=env(),
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"^execgate: slow: running for \d+ s$", result.stderr, re.M), result.stderr


def test_a_quick_call_is_quiet_on_stderr(daemon: Daemon) -> None:
    args = ["call", "read_file", "--arg", "path=nothing.txt"]
    result = subprocess.run(
        cli(daemon.address, *args, who="bot"), capture_output=True, text=True, timeout=60, env=env()
    )
    assert result.stderr == ""
    assert re.match(
        r"FAILURE not_found \(field arguments\.path\)\s+run default\s+call\s+call_", result.stdout
    ), result.stdout


def test_when_the_daemon_dies_the_call_id_to_reconcile_is_printed(tmp_path: Path) -> None:
    d = Daemon(tmp_path).start()
    args = ["call", "run_command", "--args-json", '{"argv": ["sleep", "30"]}', "--run", "r1"]
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            cli(d.address, *args, "--call-id", "doomed", "--progress-every", "0.2"),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env(),
        )
    # The CLI's own word that it saw the call start (the journal says so earlier: on a
    # busy machine the STARTED event may not have reached the CLI yet).
    wait_until(lambda: "running for" in stderr_path.read_text(), "the CLI to see the call run")
    d.kill()
    out, _ = proc.communicate(timeout=60)
    err = stderr_path.read_text()
    assert proc.returncode == 69, (out, err)
    assert "Traceback" not in err
    assert "the daemon went away while the call was running" in err
    assert "execgate calls show doomed --run r1" in err
    d.restart()
    try:
        with Client(d.address) as c:
            record = c.get_call("doomed", run_id="r1")
        assert record.outcome is not None
        assert record.outcome.status is Status.UNKNOWN_OUTCOME
    finally:
        d.stop()
