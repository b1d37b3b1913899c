"""One daemon, two languages: a Python agent and a TypeScript agent (client/typescript),
each with its own identity, each do 10 read-modify-write increments of the same file at
the same time. Every increment is one `run_command`, which claims the whole workspace
for writing, so the daemon's scheduler serializes them across clients and languages:
the file ends at 20.

Both runs are Loop runs, recorded by the daemon's Runs service in the one record format:
the Python loop's `Machine.replay` and `rebuild` read the TypeScript run as their own.

Needs the TypeScript client built (`make test` builds it first: `make test-ts`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from execgate.client import CallRecord, Client, Loop
from execgate.client.loop.record import rebuild
from execgate.client.loop.states import Machine, State
from execgate.client.loop.tally import Tally
from execgate.client.models.scripted import ScriptedModel
from tests.auth_support import Who, write_identities
from tests.daemon import Daemon, give

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "client" / "typescript" / "dist" / "test" / "support" / "counter-agent.js"
INCREMENT = ["sh", "-c", "n=$(cat counter.txt); echo $((n+1)) > counter.txt"]
N = 10
TOKENS = {name: f"{name}-" + name[0] * 40 for name in ("pyagent", "tsagent", "olga")}
PEOPLE = [
    Who("pyagent", ("agent",), token=TOKENS["pyagent"]),
    Who("tsagent", ("agent",), token=TOKENS["tsagent"]),
    Who("olga", ("operator",), token=TOKENS["olga"]),
]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    identities = write_identities(tmp_path / "identities.yaml", PEOPLE)
    home = tmp_path / "daemon"
    home.mkdir()
    d = Daemon(home, "--identities", str(identities), "--sandbox", "process").start()
    yield d
    if d.proc is not None and d.proc.poll() is None:
        d.stop()


def node() -> str:
    found = shutil.which("node")
    if found is None or not AGENT.exists():
        pytest.fail(f"needs node and the built TypeScript client ({AGENT}): run `make test-ts`")
    return found


def python_agent(daemon: Daemon) -> Loop:
    steps = [ScriptedModel.calls(("run_command", {"argv": INCREMENT}))] * N
    model = ScriptedModel([*steps, ScriptedModel.answer(f"incremented {N} times")])
    client = Client(daemon.address, token=TOKENS["pyagent"])
    # The same (empty) result each time is the job, not a lack of progress.
    return Loop(client, model, limits={"max_repeats": N + 1})


def test_python_and_typescript_agents_share_one_file_through_the_scheduler(
    daemon: Daemon,
) -> None:
    (daemon.workspace / "counter.txt").write_text("0\n")
    give(daemon.workspace / "counter.txt")  # the commands' file, as if they had made it
    ts = subprocess.Popen(
        [node(), str(AGENT), "--addr", daemon.address, "--increments", str(N)],
        env={**os.environ, "EXECGATE_TOKEN": TOKENS["tsagent"]},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert ts.stdin is not None
    assert ts.stdout is not None
    try:
        assert ts.stdout.readline().strip() == "ready", ts.stderr.read() if ts.stderr else ""
        loop = python_agent(daemon)
        ts.stdin.write("go\n")  # both agents start now
        ts.stdin.flush()
        with loop.client:
            py_result = loop.run(f"increment counter.txt {N} times")
        out, err = ts.communicate(timeout=60)
    finally:
        if ts.poll() is None:
            ts.kill()
            ts.wait()
    assert ts.returncode == 0, err
    ts_result = json.loads(out.strip().splitlines()[-1])

    assert py_result.state is State.COMPLETED, py_result.reason
    assert ts_result["state"] == "completed", ts_result
    assert (daemon.workspace / "counter.txt").read_text().strip() == str(2 * N)

    with Client(daemon.address, token=TOKENS["olga"]) as olga:
        runs = {py_result.run_id: "pyagent", ts_result["runId"]: "tsagent"}
        windows = []
        for run_id, agent in runs.items():
            detail = olga.runs.get(run_id)
            assert detail.run.owner == agent
            assert len(detail.calls) == N
            for call in detail.calls:
                # The journal names the identity that authenticated, per language.
                assert call.agent == agent, call
                assert call.outcome is not None
                assert call.outcome.ok, call
                assert olga.get_call(call.call_id, run_id=run_id).agent == agent
            windows.append((min(c.created_at for c in detail.calls), max_at(detail.calls)))
        labels = {r.run_id: r.labels.get("client") for r in olga.runs.find()}
        assert labels == {py_result.run_id: "python", ts_result["runId"]: "typescript"}

        # They really ran at the same time: each agent's calls overlap the other's.
        (py_first, py_last), (ts_first, ts_last) = windows
        assert py_first < ts_last, windows
        assert ts_first < py_last, windows

        # The Python loop reads the TypeScript run's record as its own.
        detail = olga.runs.get(ts_result["runId"])
        machine = Machine.replay(detail.run.run_id, detail.events)
        assert machine.state is State.COMPLETED
        outcomes = {c.call_id: c.outcome for c in detail.calls if c.outcome is not None}
        rebuilt = rebuild(detail.run.goal, detail.events, outcomes, Tally(started_at=0.0), 4000)
        roles = [m.role for m in rebuilt.conversation.messages]
        assert roles == ["user", *(["assistant", "tool_results"] * N), "assistant"]
        assert [p.call_id for p, _ in rebuilt.conversation.done] == [
            f"s{i}c1" for i in range(1, N + 1)
        ]

    listed = subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", "runs", "list", "--json"],
        env={**os.environ, "EXECGATE_ADDR": daemon.address, "EXECGATE_TOKEN": TOKENS["olga"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    owners = {r["run_id"]: r["owner"] for r in json.loads(listed.stdout)}
    assert owners == runs
    # The operators' timeline reads the TypeScript run like a Python one.
    traced = subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", "trace", ts_result["runId"], "--json"],
        env={**os.environ, "EXECGATE_ADDR": daemon.address, "EXECGATE_TOKEN": TOKENS["olga"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = json.loads(traced.stdout)["rows"]
    assert [r["call_id"] for r in rows] == [f"s{i}c1" for i in range(1, N + 1)]
    assert {r["status"] for r in rows} == {"success"}


def max_at(calls: Sequence[CallRecord]) -> float:
    """When the last call of a run finished (its `finished` mark)."""
    ends = []
    for call in calls:
        mark = call.outcome.mark("finished") if call.outcome is not None else None
        ends.append(mark.at if mark is not None else call.created_at)
    return max(ends)
