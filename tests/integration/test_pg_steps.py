"""Loop steps (Runs.Step) on real daemons sharing one PostgreSQL journal (the session's
throwaway server, tests/pg_support.py): a client `Loop` through one of them, and a run
started on one daemon and stepped on the other, then on the first again (whose cached
history is stale by then).

What is checked is what the daemons report and what the shared journal and the disk
hold: the run's history continuous and legal, the calls' rows with their workspace and
the daemon that ran them, the files a gated `write_file` (its durable intent begun on the
journal's loop: `begin_intent`) wrote in the run's workspace, each command run once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execgate.client import Call, Client, Loop, Status
from execgate.client.loop.states import State
from execgate.client.models.scripted import ScriptedModel
from tests.auth_support import write_identities
from tests.daemon import Daemon
from tests.loop_support import (
    PEOPLE,
    TOKENS,
    assert_continuous,
    counting,
    edges,
    lines,
    opening,
    step_opening,
    the_end,
)
from tests.pg_support import PgServer, pg_rows

# Two daemons start per module: a minute on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

S = ScriptedModel
POLICY = """\
version: 1
default: deny
rules:
  - id: files
    effect: allow
    tools: [read_file, write_file, list_dir]
    reason: files are fine
  - id: scripts
    effect: allow
    tools: [run_command]
    argv_prefix: [[sh, -c]]
    reason: small scripts are harmless
workspaces:
  - {{name: home, root: "{root}/home", agents: [bot]}}
  - {{name: default, agents: [bot]}}
"""


@dataclass
class Pair:
    daemons: list[Daemon]
    # The `home` workspace's root, where the runs here work.
    home: Path
    url: str

    def client(self, i: int) -> Client:
        return Client(self.daemons[i].address, token=TOKENS["bot"])

    def rows(self, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        return pg_rows(self.url, query, params)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer) -> Iterator[Pair]:
    """Two daemons on one database, one policy and one `home` workspace."""
    root = tmp_path_factory.mktemp("pgsteps")
    url = pg_server.database("s" + hashlib.sha256(str(root).encode()).hexdigest()[:16])
    identities = write_identities(root / "identities.yaml", PEOPLE)
    (root / "policy.yaml").write_text(POLICY.format(root=root))
    daemons = []
    for i in (1, 2):
        (root / f"d{i}").mkdir()
        daemons.append(
            Daemon(
                root / f"d{i}",
                *("--journal", url, "--locks", "postgresql", "--sandbox", "process"),
                *("--identities", str(identities), "--policy", str(root / "policy.yaml")),
            )
        )
    try:
        for d in daemons:
            d.start()
        yield Pair(daemons, root / "home", url)
    finally:
        for d in daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()


def _write(run_id: str, path: str, content: str, call_id: str) -> Call:
    """A gated write as a loop sends it (a step's calls carry their keys)."""
    return Call(
        tool="write_file",
        arguments={"path": path, "content": content},
        call_id=call_id,
        idempotency_key=f"{run_id}:{call_id}",
    )


def test_a_loop_on_a_daemon_on_postgresql_runs_its_steps_and_completes(pair: Pair) -> None:
    model = S(
        [
            S.calls(
                ("write_file", {"path": "loop.txt", "content": "from the loop"}),
                ("run_command", {"argv": ["sh", "-c", "echo ran >> loop-ran.txt"]}),
            ),
            S.calls(("read_file", {"path": "loop.txt"})),
            S.answer("wrote it"),
        ]
    )
    with Client(pair.daemons[0].address, token=TOKENS["bot"], workspace="home") as c:
        result = Loop(c, model).run("write a file")
        detail = c.runs.get(result.run_id)
    assert result.state is State.COMPLETED, result
    assert_continuous(result.run_id, detail.events)
    # Two steps, each into running_tools and back out with its batch's end.
    assert edges(detail.events).count(("validating", "running_tools")) == 2
    assert edges(detail.events).count(("running_tools", "requesting_model")) == 2
    assert (pair.home / "loop.txt").read_text() == "from the loop"
    assert lines(pair.home / "loop-ran.txt") == ["ran"]
    found = pair.rows(
        "SELECT tool, status, workspace FROM calls WHERE run_id = ? ORDER BY seq",
        (result.run_id,),
    )
    assert found == [
        ("write_file", "success", "home"),
        ("run_command", "success", "home"),
        ("read_file", "success", "home"),
    ]
    assert pair.rows("SELECT workspace FROM runs WHERE run_id = ?", (result.run_id,)) == [("home",)]


def test_a_run_started_on_one_daemon_is_stepped_on_the_other_and_back(pair: Pair) -> None:
    run_id = "across"
    with pair.client(0) as a, pair.client(1) as b:
        first = [
            _write(run_id, "b.txt", "by daemon 2", "s1c1"),
            counting(run_id, "count.txt", "s1c2"),
        ]
        m, events = opening(a, run_id, first, workspace="home")

        on_b = b.runs.step(run_id, events, first)

        assert [o.status for o in on_b.outcomes] == [Status.SUCCESS] * 2, on_b.outcomes
        m.record(the_end(on_b))
        # Back on daemon 1, whose own record of the run stops before daemon 2's step.
        second = [counting(run_id, "count.txt", "s2c1")]
        on_a = a.runs.step(run_id, step_opening(m, second), second)

        assert [o.status for o in on_a.outcomes] == [Status.SUCCESS], on_a.outcomes
        m.record(the_end(on_a))
        detail = b.runs.get(run_id)
    assert_continuous(run_id, detail.events)
    assert detail.events[-1] == the_end(on_a)
    assert (detail.run.state, detail.run.last_seq) == (State.REQUESTING_MODEL, 7)
    assert detail.run.workspace == "home"
    assert (pair.home / "b.txt").read_text() == "by daemon 2"
    assert lines(pair.home / "count.txt") == ["s1c2", "s2c1"]
    ran_by = pair.rows(
        "SELECT c.call_id, c.workspace, d.name FROM calls c JOIN daemons d ON d.id = c.daemon "
        "WHERE c.run_id = ? ORDER BY c.seq",
        (run_id,),
    )
    assert [(call, ws) for call, ws, _ in ran_by] == [
        ("s1c1", "home"),
        ("s1c2", "home"),
        ("s2c1", "home"),
    ]
    # Daemon 2 ran the first step's calls, daemon 1 the second's.
    assert ran_by[0][2] == ran_by[1][2] != ran_by[2][2]
