"""Commands that say what they touch, enforced: `run_command` with `reads`/`writes` and
declared command tools, through a real daemon in real bwrap (and docker, where the
docker tests run: EXECGATE_REQUIRE_DOCKER=1 makes a missing dockerd a failure).

What is checked is what the daemon reports and what is on disk: outcomes and their
timeline marks (two commands on different files overlap; undeclared ones do not),
WAITING events, the lock plan `Explain` shows, and the files a refused write left
alone. The overlap is proved without timing: each command waits for the other's
file to fill, so run one after the other they would both fail.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from execgate.client import Call, Client, EventKind, Outcome, Status
from tests.daemon import Daemon
from tests.support import sandbox_serve_args

# Writes its letter into its own file, then waits (at most 20 s) for the other's.
MEET = (
    'echo "$1" > "$2"; i=0; while [ ! -s "$3" ] && [ $i -lt 400 ]; do sleep 0.05; '
    'i=$((i+1)); done; [ -s "$3" ]'
)
TOOLS = {
    "version": 1,
    "tools": [
        {
            "name": "put_in",
            "description": "writes text to path, declaring it writes dir",
            "input_schema": {
                "type": "object",
                "properties": {"dir": {"type": "string"}, "path": {"type": "string"}},
                "required": ["dir", "path"],
            },
            "argv": ["sh", "-c", 'echo put > "$1"', "sh", "{path}"],
            "effects": {"writes": ["{dir}"]},
        },
        {
            "name": "peek",
            "description": "reads path and tries to write beside it",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            "argv": ["sh", "-c", 'cat "$1" && echo x > "$1.new"', "sh", "{path}"],
            "effects": {"reads": ["{path}"]},
        },
    ],
}
POLICY = "version: 1\ndefault: deny\nrules:\n  - {id: all, effect: allow, tools: ['*']}\n"


def start(root: Path, backend: str) -> Daemon:
    (root / "tools.yaml").write_text(yaml.safe_dump(TOOLS, sort_keys=False))
    (root / "policy.yaml").write_text(POLICY)
    args = sandbox_serve_args(backend, root)
    return Daemon(
        root, *args, "--tools", str(root / "tools.yaml"), "--policy", str(root / "policy.yaml")
    ).start(timeout=60)


@pytest.fixture(scope="module", params=["bwrap", "bwrap-cold", "docker"])
def confined(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    d = start(tmp_path_factory.mktemp(f"effects-{request.param}"), request.param)
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def bwrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start(tmp_path_factory.mktemp("effects-bwrap-only"), "bwrap")
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start(tmp_path_factory.mktemp("effects-process"), "process")
    yield d
    assert d.stop() == 0


def area(d: Daemon, name: str) -> tuple[Path, str]:
    """A fresh directory in the workspace (world-writable: docker's user), and its name."""
    rel = f"{name}-{uuid.uuid4().hex[:8]}"
    path = d.workspace / rel
    path.mkdir()
    os.chmod(path, 0o777)
    return path, rel


def command(argv: list[str], call_id: str, **declared: Any) -> Call:
    return Call(tool="run_command", arguments={"argv": argv, **declared}, call_id=call_id)


def span(o: Outcome) -> tuple[float, float]:
    start, end = o.mark("started"), o.mark("finished")
    assert start is not None, o
    assert end is not None, o
    return start.at, end.at


def stream(d: Daemon, calls: list[Call]) -> tuple[dict[str, Outcome], list[Any]]:
    with Client(d.address) as c:
        events = list(c.stream(calls, run_id=f"fx-{uuid.uuid4().hex[:8]}"))
    outcomes = {e.call_id: e.outcome for e in events if e.kind is EventKind.FINISHED}
    return outcomes, [e for e in events if e.kind is EventKind.WAITING]  # type: ignore[misc]


# ---------------------------------------------------------------- enforced (bwrap, docker)


def test_two_commands_declaring_different_files_run_at_once(confined: Daemon) -> None:
    """Each writes its file and waits for the other's (which it does not declare: the
    sandbox lets it read anything, and lock conflicts would serialize them); both read
    a common file (READ and READ share)."""
    here, rel = area(confined, "meet")
    for name in ("a.txt", "b.txt", "common.txt"):
        (here / name).write_text("")
        os.chmod(here / name, 0o666)
    common = f"{rel}/common.txt"
    calls = [
        command(["sh", "-c", MEET, "sh", "a", f"{rel}/a.txt", f"{rel}/b.txt"], "a",
                writes=[f"{rel}/a.txt"], reads=[common]),
        command(["sh", "-c", MEET, "sh", "b", f"{rel}/b.txt", f"{rel}/a.txt"], "b",
                writes=[f"{rel}/b.txt"], reads=[common]),
    ]  # fmt: skip
    outcomes, waiting = stream(confined, calls)
    a, b = outcomes["a"], outcomes["b"]
    assert (a.status, b.status) == (Status.SUCCESS, Status.SUCCESS), (a.message, b.message)
    (a0, a1), (b0, b1) = span(a), span(b)
    assert a0 < b1
    assert b0 < a1  # the two ran at the same time
    assert waiting == []
    assert (here / "a.txt").read_text() == "a\n"
    assert (here / "b.txt").read_text() == "b\n"


def test_a_command_declaring_a_cannot_change_b(confined: Daemon) -> None:
    here, rel = area(confined, "ab")
    (here / "a").mkdir()
    (here / "b").mkdir()
    os.chmod(here / "a", 0o777)
    (here / "b" / "keep.txt").write_text("b\n")
    os.chmod(here / "b", 0o777)
    os.chmod(here / "b" / "keep.txt", 0o666)
    before = sorted(p.name for p in (here / "b").iterdir())
    script = f"echo a > {rel}/a/made.txt && echo changed > {rel}/b/keep.txt"
    outcomes, _ = stream(confined, [command(["sh", "-c", script], "c", writes=[f"{rel}/a/"])])
    o = outcomes["c"]
    assert (o.status, o.error_class) == (Status.FAILURE, "permission_denied"), o
    assert "a write outside the declared paths was refused" in o.message
    assert f"may write only {rel}/a/" in o.message
    assert (here / "a" / "made.txt").read_text() == "a\n"  # inside the declaration: done
    assert (here / "b" / "keep.txt").read_text() == "b\n"
    assert sorted(p.name for p in (here / "b").iterdir()) == before
    assert not (here / "outside.txt").exists()


def test_a_declared_tools_writes_and_reads_are_enforced_the_same_way(confined: Daemon) -> None:
    here, rel = area(confined, "tool")
    (here / "a").mkdir()
    (here / "b").mkdir()
    for sub in ("a", "b"):
        os.chmod(here / sub, 0o777)
    (here / "b" / "in.txt").write_text("data\n")
    with Client(confined.address) as c:
        inside = c.execute_one("put_in", dir=f"{rel}/a", path=f"{rel}/a/x.txt")
        outside = c.execute_one("put_in", dir=f"{rel}/a", path=f"{rel}/b/x.txt")
        peeked = c.execute_one("peek", path=f"{rel}/b/in.txt")
    assert inside.status is Status.SUCCESS, inside
    assert (here / "a" / "x.txt").read_text() == "put\n"
    assert (outside.status, outside.error_class) == (Status.FAILURE, "permission_denied")
    assert not (here / "b" / "x.txt").exists()
    # Declared reads only: the whole workspace is read-only to it.
    assert (peeked.status, peeked.error_class) == (Status.FAILURE, "permission_denied")
    assert peeked.text.startswith("data\n")
    assert not (here / "b" / "in.txt.new").exists()


# ---------------------------------------------------------------- bwrap


def test_an_undeclared_command_still_serializes(bwrap: Daemon) -> None:
    here, rel = area(bwrap, "serial")
    calls = [
        command(["sh", "-c", "sleep 0.3"], "u1"),
        command(["sh", "-c", "sleep 0.3"], "u2"),
        command(["true"], "d3", writes=[f"{rel}/x.txt"]),
    ]
    outcomes, waiting = stream(bwrap, calls)
    assert all(o.status is Status.SUCCESS for o in outcomes.values())
    spans = sorted(span(o) for o in outcomes.values())
    assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans)), spans
    assert {e.call_id for e in waiting} == {"u2", "d3"}
    assert all("workspace" in e.keys for e in waiting)
    assert not (here / "x.txt").exists()  # made for d3, untouched, removed again


def test_escapes_in_declarations_are_rejected(bwrap: Daemon) -> None:
    here, rel = area(bwrap, "escape")
    (here / "out").symlink_to("/etc")
    (here / "in").mkdir()
    (here / "inner").symlink_to(here / "in")
    cases = {
        "up": {"writes": ["../x"]},
        "far": {"reads": [f"{rel}/../../../etc/passwd"]},
        "link": {"writes": [f"{rel}/out"]},
        "via": {"reads": [f"{rel}/out/passwd"]},
        "through": {"writes": [f"{rel}/out/new.txt"]},
    }
    calls = [command(["true"], name, **d) for name, d in cases.items()]
    outcomes, _ = stream(bwrap, calls)
    for name, declared in cases.items():
        o = outcomes[name]
        field = f"arguments.{next(iter(declared))}[0]"
        assert (o.status, o.error_class, o.field) == (
            Status.REJECTED,
            "permission_denied",
            field,
        ), (name, o)
        assert "resolves outside the workspace" in o.message
    with Client(bwrap.address) as c:
        tool = c.execute_one("put_in", dir="../x", path="x")
        [plan] = c.explain([command(["true"], "p", writes=[f"{rel}/inner"])])
    assert (tool.status, tool.error_class, tool.field) == (
        Status.REJECTED,
        "permission_denied",
        "arguments.dir",
    )
    # A symlink inside the workspace is canonicalised like every path argument.
    assert plan.claims == ((f"file:{os.path.realpath(here / 'in')}", "write"),)


def test_a_missing_write_path_is_made_and_left_only_if_written(bwrap: Daemon) -> None:
    """A missing write path is made in its (existing) directory when the call starts, and
    removed again if the command left it as it was made; a missing directory on the way
    fails the call before it runs, and a declared file cannot be replaced by a rename."""
    here, rel = area(bwrap, "made")
    calls = [
        command(["true"], "idle", writes=[f"{rel}/idle.txt", f"{rel}/dir/"]),
        command(["sh", "-c", f"echo hi > {rel}/used.txt"], "used", writes=[f"{rel}/used.txt"]),
        command(["sh", "-c", f"echo hi > {rel}/d2/f"], "dir", writes=[f"{rel}/d2/"]),
        command(["true"], "deep", writes=[f"{rel}/no/such/f"]),
        command(["sh", "-c", f"echo hi > {rel}/f.tmp && mv {rel}/f.tmp {rel}/f"], "rename",
                writes=[f"{rel}/f"]),
    ]  # fmt: skip
    outcomes, _ = stream(bwrap, calls)
    for name in ("idle", "used", "dir"):
        assert outcomes[name].status is Status.SUCCESS, outcomes[name]
    deep = outcomes["deep"]
    assert (deep.status, deep.error_class, deep.field) == (
        Status.FAILURE,
        "not_found",
        "arguments.writes[0]",
    )
    assert "its directory does not exist" in deep.message
    assert deep.mark("started") is not None  # under its locks; the command never ran
    assert deep.structured == {}
    assert (here / "used.txt").read_text() == "hi\n"
    assert (here / "d2" / "f").read_text() == "hi\n"
    # The file made for `rename` stays only if written; its temp file was refused.
    assert outcomes["rename"].error_class == "permission_denied"
    assert sorted(p.name for p in here.iterdir()) == ["d2", "used.txt"]


# ---------------------------------------------------------------- process: not enforced


def test_the_process_backend_keeps_the_whole_workspace_lock(process: Daemon) -> None:
    here, rel = area(process, "proc")
    calls = [
        command(["sh", "-c", "sleep 0.3"], "p1", writes=[f"{rel}/a.txt"]),
        command(["sh", "-c", f"sleep 0.3; echo x > {rel}/b.txt"], "p2", writes=[f"{rel}/c.txt"]),
    ]
    outcomes, waiting = stream(process, calls)
    p1, p2 = outcomes["p1"], outcomes["p2"]
    assert (p1.status, p2.status) == (Status.SUCCESS, Status.SUCCESS)
    assert span(p2)[0] >= span(p1)[1]  # one after the other, although their files differ
    assert [e.call_id for e in waiting] == ["p2"]
    granted = p1.mark("lock_granted")
    assert granted is not None
    assert granted.detail == "the whole workspace: this sandbox cannot enforce the declared paths"
    assert (here / "b.txt").read_text() == "x\n"  # nothing confines it: said, not hidden
    with Client(process.address) as c:
        [plan] = c.explain(calls[:1])
    assert ("workspace", "X") in plan.locks
