"""One daemon, many workspaces: the policy's `workspaces:` through a real daemon, real
commands in bwrap and a real MCP server.

Identities: `alice` and `bob` each get `home` (their own directory under `spaces/`);
`carol` and `dave` (group builders) get `home` and `shared`; `alice` also gets `inner`,
whose root lies inside the daemon's --workspace (refused: roots may not nest); `erin`
gets none; `olga` (an operator and an agent) gets `default`, the daemon's --workspace.
What is checked is what the daemon reports and what is on disk: where files landed,
outcomes with their fields and marks, WAITING events, journal records, the lock plan.
Nothing waits on time: commands that must overlap wait for a file the test makes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Call, Client, EventKind, Outcome, PermissionDenied, Status
from execgate.executor.policy.identity import hash_token
from tests import mcp_support as ms
from tests.cancel_support import work
from tests.daemon import Daemon, scaled
from tests.support import Streamer, wait_until

AGENTS = ("alice", "bob", "carol", "dave", "erin")
TOKENS = {name: f"{name}-" + name[0] * 40 for name in (*AGENTS, "olga")}
IDENTITIES = "version: 1\nidentities:\n" + "".join(
    f"  - {{name: {name}, roles: [{'operator, agent' if name == 'olga' else 'agent'}], "
    f"token_sha256: {hash_token(token)}"
    + (", groups: [builders]" if name in ("carol", "dave") else "")
    + "}\n"
    for name, token in TOKENS.items()
)
POLICY = """\
version: 1
default: deny
rules:
  - {{id: all, effect: allow, tools: ['*']}}
  - {{id: secrets, effect: deny, paths: ['secret/']}}
workspaces:
  - {{name: home, root: "{root}/spaces/{{agent}}", agents: [alice, bob, carol, dave]}}
  - {{name: shared, root: "{root}/shared", agents: [group:builders]}}
  - {{name: inner, root: "{root}/daemon/workspace/inner", agents: [alice]}}
  - {{name: default, agents: [role:operator]}}
"""
# Waits (at most 20 s) for the file $1 to appear in its workspace, then says so.
AWAIT = 'i=0; while [ ! -e "$1" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; ls "$1"'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("workspaces")
    (root / "identities.yaml").write_text(IDENTITIES)
    servers = [ms.entry("faulty", ms.fixture_server(), ms.new_tag())]
    d = ms.mcp_daemon(
        root / "daemon",
        servers,
        POLICY.format(root=root),
        "--identities",
        str(root / "identities.yaml"),
    ).start(timeout=60)
    yield d
    assert d.stop() == 0


def spaces(d: Daemon) -> Path:
    return d.root.parent / "spaces"


def shared(d: Daemon) -> Path:
    return d.root.parent / "shared"


def as_(d: Daemon, who: str, workspace: str = "") -> Client:
    return Client(d.address, token=TOKENS[who], workspace=workspace)


def one(d: Daemon, who: str, tool: str, workspace: str = "", **args: object) -> Outcome:
    with as_(d, who, workspace) as c:
        [outcome] = c.execute([Call(tool=tool, arguments=args)])
    return outcome


def sh(script: str, *argv: str, call_id: str = "") -> Call:
    return Call(
        tool="run_command",
        arguments={"argv": ["sh", "-c", script, "sh", *argv]},
        call_id=call_id or f"c-{uuid.uuid4().hex[:8]}",
    )


def rejected_for_workspace(o: Outcome, message: str) -> None:
    assert (o.status, o.error_class, o.field) == (Status.REJECTED, "permission_denied", "workspace")
    assert message in o.message, o.message


# ---------------------------------------------------------------- each agent its own


def test_each_agent_works_in_its_own_workspace(daemon: Daemon) -> None:
    for who in ("alice", "bob"):
        wrote = one(daemon, who, "write_file", path="notes.txt", content=f"by {who}")
        assert wrote.status is Status.SUCCESS, wrote
        assert wrote.evidence.path == str(spaces(daemon) / who / "notes.txt")
    for who in ("alice", "bob"):
        assert (spaces(daemon) / who / "notes.txt").read_text() == f"by {who}"
        assert one(daemon, who, "read_file", path="notes.txt").text == f"by {who}"
        # Named or not, `home` is the same workspace.
        assert one(daemon, who, "read_file", "home", path="notes.txt").text == f"by {who}"
    assert not (daemon.workspace / "notes.txt").exists()
    # A root the daemon made is made like its --workspace: the same owner, group and mode.
    made, like = (spaces(daemon) / "alice").stat(), daemon.workspace.stat()
    assert (made.st_uid, made.st_gid, made.st_mode) == (like.st_uid, like.st_gid, like.st_mode)
    with as_(daemon, "olga") as olga:
        records = olga.list_calls(tool="write_file", limit=1000)
    mine = {r.agent: r.workspace for r in records if r.agent in ("alice", "bob")}
    assert mine == {"alice": "home", "bob": "home"}


def test_an_agent_can_neither_read_write_nor_lock_another_agents_workspace(
    daemon: Daemon,
) -> None:
    (spaces(daemon) / "bob").mkdir(parents=True, exist_ok=True)
    bobs = spaces(daemon) / "bob" / "private.txt"
    bobs.write_text("bob's")
    for tool, args in (
        ("read_file", {"path": "../bob/private.txt"}),
        ("write_file", {"path": "../bob/private.txt", "content": "alice was here"}),
        ("read_file", {"path": str(bobs)}),
    ):
        o = one(daemon, "alice", tool, **args)
        assert (o.status, o.error_class, o.field) == (
            Status.REJECTED,
            "permission_denied",
            "arguments.path",
        ), o
    # Her commands see her workspace alone: bob's is not even there to open.
    with as_(daemon, "alice") as c:
        [looked] = c.execute([sh('ls "$1"; cat "$2"', str(spaces(daemon)), str(bobs))])
    assert looked.status is Status.FAILURE
    assert looked.text.split()[:1] == ["alice"], looked.text
    assert "bob" not in looked.text.split()
    assert "bob's" not in looked.text
    assert bobs.read_text() == "bob's"
    # Her locks are in her own tree: the keys name her workspace's root.
    with as_(daemon, "alice") as c:
        [plan] = c.explain([Call(tool="write_file", arguments={"path": "p.txt", "content": ""})])
    assert plan.claims == ((f"file:{spaces(daemon) / 'alice' / 'p.txt'}", "write"),)


def test_a_command_in_one_workspace_never_waits_for_one_in_another(daemon: Daemon) -> None:
    """bob's command (undeclared: it takes his whole workspace) waits for a file the test
    makes; meanwhile alice's undeclared command runs to its end without waiting. In one
    workspace the same pair serializes: dave's waits behind carol's."""
    go = spaces(daemon) / "bob" / f"go-{uuid.uuid4().hex[:6]}"
    go.parent.mkdir(parents=True, exist_ok=True)
    bob = Streamer(daemon.address, [sh(AWAIT, go.name, call_id="bob")], token=TOKENS["bob"])
    wait_until(lambda: bob.seen(EventKind.STARTED, "bob"), "bob's command to start", scaled(15))
    with as_(daemon, "alice") as c:
        [mine] = c.execute([sh("echo alone")])
    assert mine.status is Status.SUCCESS, mine
    assert mine.mark("waiting") is None, mine.timeline
    assert not bob.seen(EventKind.FINISHED, "bob"), "bob's command ended before alice's ran"
    go.touch()
    bob.join(scaled(30))
    assert bob.outcome("bob").status is Status.SUCCESS

    go = shared(daemon) / f"go-{uuid.uuid4().hex[:6]}"
    carol = Streamer(
        daemon.address,
        [sh(AWAIT, go.name, call_id="carol")],
        token=TOKENS["carol"],
        workspace="shared",
    )
    wait_until(lambda: carol.seen(EventKind.STARTED, "carol"), "carol's command", scaled(15))
    dave = Streamer(
        daemon.address, [sh("echo after", call_id="dave")], token=TOKENS["dave"], workspace="shared"
    )
    wait_until(lambda: dave.seen(EventKind.WAITING, "dave"), "dave's command to wait", scaled(15))
    go.touch()
    carol.join(scaled(30))
    dave.join(scaled(30))
    ended, began = carol.outcome("carol").mark("finished"), dave.outcome("dave").mark("started")
    assert ended is not None
    assert began is not None
    assert began.at >= ended.at


# ---------------------------------------------------------------- shared, runs


def test_a_shared_workspace_is_given_to_a_group_and_loses_no_update(daemon: Daemon) -> None:
    """carol and dave each increment one counter in `shared` 15 times at once (the `work`
    probe reads, sleeps, writes in bwrap): 30 increments, each read a distinct value."""
    counter = f"counter-{uuid.uuid4().hex[:6]}.txt"
    streams = [
        Streamer(
            daemon.address,
            [work(f"{who}{i:02d}", counter, write=True, seconds=0.02) for i in range(15)],
            token=TOKENS[who],
            workspace="shared",
        )
        for who in ("carol", "dave")
    ]
    outcomes = []
    for who, stream in zip(("carol", "dave"), streams, strict=True):
        stream.join(scaled(120))
        assert stream.error is None, stream.error
        outcomes += [stream.outcome(f"{who}{i:02d}") for i in range(15)]
    assert all(o.status is Status.SUCCESS for o in outcomes), [o.message for o in outcomes]
    assert sorted(int(o.text.strip()) for o in outcomes) == list(range(30))
    assert (shared(daemon) / counter).read_text().strip() == "30"
    rejected_for_workspace(
        one(daemon, "alice", "read_file", "shared", path=counter),
        "workspace 'shared' is not given to alice",
    )


def test_a_run_is_bound_to_one_workspace(daemon: Daemon) -> None:
    with as_(daemon, "carol") as c:
        run = c.runs.start("in shared", workspace="shared")
        assert run.workspace == "shared"
        [wrote] = c.execute(
            [Call(tool="write_file", arguments={"path": "run.txt", "content": "r"})],
            run_id=run.run_id,
        )
        assert wrote.status is Status.SUCCESS
        assert (shared(daemon) / "run.txt").read_text() == "r"
        [elsewhere] = c.execute(
            [Call(tool="read_file", arguments={"path": "run.txt"})],
            run_id=run.run_id,
            workspace="home",
        )
        rejected_for_workspace(elsewhere, f"run {run.run_id!r} works in workspace 'shared'")
        assert c.runs.get(run.run_id).run.workspace == "shared"
        # A run that names none is bound to its owner's first.
        assert c.runs.start("at home").workspace == "home"
    with as_(daemon, "alice") as c, pytest.raises(PermissionDenied, match="workspace"):
        c.runs.start("not hers", workspace="shared")


# ---------------------------------------------------------------- refusals


def test_a_workspace_not_given_is_rejected_with_the_same_words_as_none(daemon: Daemon) -> None:
    for name in ("shared", "default", "nowhere"):
        o = one(daemon, "bob", "write_file", name, path="x.txt", content="no")
        rejected_for_workspace(o, f"workspace {name!r} is not given to bob")
    assert not (shared(daemon) / "x.txt").exists()
    assert not (daemon.workspace / "x.txt").exists()
    rejected_for_workspace(
        one(daemon, "erin", "read_file", path="x.txt"), "no workspace is given to erin"
    )
    # The refusal is journaled with the workspace it named.
    with as_(daemon, "bob") as c:
        [record] = c.list_calls(workspace="nowhere")
    assert (record.outcome and record.outcome.status, record.workspace) == (
        Status.REJECTED,
        "nowhere",
    )


def test_roots_may_not_nest(daemon: Daemon) -> None:
    o = one(daemon, "alice", "write_file", "inner", path="x.txt", content="no")
    rejected_for_workspace(o, "nest")
    assert not (daemon.workspace / "inner" / "x.txt").exists()


def test_policy_paths_are_relative_to_the_calls_workspace(daemon: Daemon) -> None:
    for who, space in (("alice", ""), ("carol", "shared"), ("olga", "default")):
        o = one(daemon, who, "write_file", space, path="secret/key", content="k")
        assert (o.status, o.error_class) == (Status.REJECTED, "policy_denied"), (who, o)
        ok = one(daemon, who, "write_file", space, path="open/key", content="k")
        assert ok.status is Status.SUCCESS, (who, ok)
    assert (daemon.workspace / "open" / "key").exists()  # olga's `default`


# ---------------------------------------------------------------- journal, CLI, MCP


def test_the_cli_names_a_workspace_and_lists_by_it(daemon: Daemon) -> None:
    name = f"cli-{uuid.uuid4().hex[:6]}.txt"
    cli = [sys.executable, "-m", "execgate.executor.cli"]
    env = {**os.environ, "EXECGATE_ADDR": daemon.address}
    args = ["--arg", f"path={name}", "--arg", "content=c", "--workspace", "shared"]
    made = subprocess.run(
        [*cli, "call", "write_file", *args, "--json", "--quiet"],
        env={**env, "EXECGATE_TOKEN": TOKENS["carol"]},
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert (shared(daemon) / name).exists()
    listed = subprocess.run(
        [*cli, "calls", "list", "--workspace", "shared", "--tool", "write_file", "--json"],
        env={**env, "EXECGATE_TOKEN": TOKENS["olga"]},
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    records = json.loads(listed.stdout)
    assert records
    assert {r["workspace"] for r in records} == {"shared"}
    assert any(json.loads(r["arguments_json"])["path"] == name for r in records)


def test_an_mcp_server_has_a_process_per_workspace(daemon: Daemon) -> None:
    """The fixture server writes where it is told, relative to its cwd: each agent's call
    lands in that agent's workspace, served by a process of its own."""
    for who in ("alice", "bob"):
        o = one(daemon, who, "faulty.write_any", target="from-mcp.txt", text=who)
        assert o.status is Status.SUCCESS, o
    for who in ("alice", "bob"):
        assert (spaces(daemon) / who / "from-mcp.txt").read_text() == who
    with as_(daemon, "olga") as c:
        assert ms.provider(c, "faulty").running >= 2
