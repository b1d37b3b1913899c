"""The examples run as documented (examples/README.md), against a real daemon."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client
from execgate.client.loop.states import State
from tests.daemon import Daemon
from tests.loop_support import start_daemon, stop

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("examples"))
    yield d
    stop(d)


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "minimal_loop.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=EXAMPLES.parent,
    )


def test_minimal_loop_shows_a_completed_and_an_expired_run(daemon: Daemon) -> None:
    done = run_example("--addr", daemon.address)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "scenario 1" in out
    assert "ended: completed -- final answer accepted" in out
    assert "answer: the note says: hello from a loop" in out
    assert "ended: expired (rule max_steps)" in out
    assert out.index("ended: completed") < out.index("ended: expired")
    assert "validating -> completed" in out
    assert "requesting_model -> expired" in out

    # What it printed is what the daemon recorded.
    with Client(daemon.address) as client:
        runs = {r.state: r for r in client.runs.find()}
    assert set(runs) == {State.COMPLETED, State.EXPIRED}
    assert runs[State.EXPIRED].reason in out
    for run in runs.values():
        assert f"run {run.run_id} ended: {run.state.value}" in out
    assert (daemon.workspace / "minimal_loop_note.txt").read_text() == "hello from a loop\n"


def test_minimal_loop_says_when_no_daemon_answers(tmp_path: Path) -> None:
    missing = run_example("--addr", f"unix:{tmp_path / 'nothing.sock'}")
    assert missing.returncode == 2
    assert "no execgate daemon answers" in missing.stderr
    assert missing.stdout == ""
