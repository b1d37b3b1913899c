"""`execgate demo` end to end: its private daemon, the scripted agent, the transcript."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from execgate.client import Client
from tests.daemon import Daemon


def test_the_demo_narrates_each_thing_it_promises() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # Two reads ran without either waiting for the other.
    assert "call s1c1 finished success" in out
    assert "call s1c2 finished success" in out
    assert not re.search(r"call s1c\d waits", out)
    # Two writes to one file: the second waited behind the first, then ran.
    assert re.search(r"call s2c2 waits its turn behind \S+/s2c1", out)
    # A call parked for approval, decided by the second identity, then run.
    assert re.search(r"call s3c1 awaiting approval appr_\w+", out)
    assert "approver approved" in out
    assert "running_tools -> awaiting_approval" in out
    assert "call s3c1 finished success" in out
    # The SIGTERM-ignoring command: grace expired, then forced, with the times.
    forced = re.search(
        r"call s4c1 finished (\w+)/timeout, force_terminated \(signal sent; "
        r"grace_expired \+([\d.]+)s, force_terminated \+([\d.]+)s",
        out,
    )
    assert forced is not None, out
    assert 0.4 <= float(forced.group(2)) <= 1.5  # the demo policy's grace_s: 0.5
    # The run's terminal reason.
    assert re.search(r"run run_\w+ ended completed: final answer accepted", out)


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "COLUMNS": "80", "NO_COLOR": "1"},
    )


def test_against_a_daemon_without_the_demo_rules_it_says_so_and_stops(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path).start()  # the shipped default policy
    try:
        done = _demo("--addr", daemon.address)
        with Client(daemon.address) as c:
            ran = c.list_calls(limit=10)
    finally:
        daemon.stop()
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"the policy of the daemon at {daemon.address} lacks the demo's rules" in done.stderr
    assert re.search(
        r"run_command touch published\.txt: would be \w+ .*the demo needs ask", done.stderr
    )
    assert "execgate demo --print-policy" in done.stderr
    assert done.stdout == ""  # no narration of steps that did not happen
    assert ran == []  # Explain only: nothing ran


def test_the_private_demo_can_keep_its_journal_to_trace(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    done = _demo("--keep", str(keep))
    assert done.returncode == 0, done.stdout + done.stderr
    [run_id] = re.findall(r"run (run_\w+) ended completed", done.stdout)
    assert f"journal kept in {keep / 'state'}" in done.stdout
    assert f"execgate trace {run_id} --addr unix:{keep / 'state' / 'execgate.sock'}" in done.stdout
    token = (keep / "operator.token").read_text().strip()
    assert (keep / "operator.token").stat().st_mode & 0o077 == 0
    daemon = Daemon(
        keep, "--policy", str(keep / "policy.yaml"), "--identities", str(keep / "identities.yaml")
    ).start()
    try:
        traced = subprocess.run(
            # --token=: a token may start with "-"
            [
                sys.executable,
                "-m",
                "execgate.executor.cli",
                "trace",
                run_id,
                f"--token={token}",
                "--addr",
                daemon.address,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "80", "NO_COLOR": "1"},
        )
    finally:
        daemon.stop()
    assert traced.returncode == 0, traced.stderr
    assert "stop: completed" in traced.stdout
    assert re.search(r"^s4c1 .*│ unknown_outcome/timeout$", traced.stdout, re.M), traced.stdout
    assert max(len(line) for line in traced.stdout.splitlines()) <= 80


def test_the_demo_policy_can_be_printed() -> None:
    done = _demo("--print-policy")
    assert done.returncode == 0
    assert "id: publish-needs-a-human" in done.stdout
