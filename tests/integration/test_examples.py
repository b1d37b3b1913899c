"""The examples run as documented (examples/README.md), against a real daemon."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client
from execgate.client.loop.states import State
from tests.daemon import Daemon, scaled
from tests.framework_support import start_framework_daemon
from tests.loop_support import TOKENS, start_daemon, stop

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


# ------------------------------------------------------------------ examples/frameworks


def run_framework_example(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "frameworks" / script), *args],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=EXAMPLES.parent,
    )


def sections(out: str, native_title: str) -> tuple[str, str]:
    """The example's two reports: the framework's own run, then execgate's."""
    assert native_title in out, out
    native, _, gated = out.partition("through execgate:")
    assert gated, out
    return native, gated


def lost(section: str, counter: str) -> int:
    m = re.search(rf"{counter}: 0 -> (\d+) after 6 increments: (\d+) lost", section)
    assert m is not None, section
    assert int(m[1]) + int(m[2]) == 6
    return int(m[2])


def test_the_openai_agents_example_loses_updates_natively_and_none_through_execgate() -> None:
    done = run_framework_example("openai_agents_increments.py")  # its own private daemon
    assert done.returncode == 0, done.stderr
    native, gated = sections(done.stdout, "run by the OpenAI Agents SDK itself:")
    assert lost(native, "counter-sdk.txt") >= 1
    assert lost(gated, "counter-execgate.txt") == 0
    assert "increments running at the same time as another: 0 pair(s)" in gated
    assert "the 3 peeks of notes.txt ran together: yes" in gated


def test_the_langgraph_example_against_a_daemon_it_is_pointed_at(tmp_path: Path) -> None:
    served = start_framework_daemon(tmp_path)  # the examples' tools file and policy
    try:
        done = run_framework_example(
            "langgraph_increments.py",
            *("--addr", served.address, "--workspace", str(served.workspace)),
            *("--token", TOKENS["bot"]),
        )
    finally:
        stop(served)
    assert done.returncode == 0, done.stderr
    native, gated = sections(done.stdout, "run by LangGraph's ToolNode itself:")
    assert lost(native, "counter-toolnode.txt") >= 1
    assert lost(gated, "counter-execgate.txt") == 0
    assert (served.workspace / "counter-execgate.txt").read_text() == "6\n"
    assert "increments running at the same time as another: 0 pair(s)" in gated
    assert "the 3 peeks of notes.txt ran together: yes" in gated
