"""Check-then-use races: every file tool under a path component swapped with a symlink.

Each test points a tool at a name inside the workspace that a `Swapper` process
exchanges, continuously and atomically, with a symlink to a place outside the
workspace holding a marker. It sends `race_rounds(N)` calls and asserts zero
escapes: no result shows the outside marker, nothing outside is created or
changed. It also asserts the race was real -- some calls met the symlink (refused)
and some the real thing (served) -- so a swapper that never raced cannot pass.

Every test runs under both walks: openat2 (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
and the O_NOFOLLOW component walk used where openat2 is missing
(EXECGATE_NO_OPENAT2=1).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execgate.client import Call, Client, Outcome, Status
from tests.daemon import Daemon
from tests.security.budget import race_rounds
from tests.security.swap import Swapper

SECRET = "OUTSIDE-" + uuid.uuid4().hex
INSIDE = "inside-text"
BATCH = 25


@pytest.fixture(scope="module", params=["openat2", "walk"])
def daemon(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp(f"races-{request.param}")
    env = {"EXECGATE_NO_OPENAT2": "1"} if request.param == "walk" else {}
    d = Daemon(root, env=env).start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def eg(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.address) as c:
        yield c


@dataclass(frozen=True)
class Stage:
    """`area/d` (a real directory, or file) that trades places with `area/d.swap`, a
    symlink to `outside/d`, which holds the same names with the secret in them."""

    area: Path  # inside the workspace
    rel: str  # `area` as a tool argument
    outside: Path  # outside the workspace

    @property
    def inside(self) -> Path:
        return self.area / "d"

    @property
    def target(self) -> Path:
        return self.outside / "d"

    def arg(self, *parts: str) -> str:
        return "/".join([self.rel, "d", *parts])

    def swapper(self) -> Swapper:
        return Swapper(self.inside, self.area / "d.swap")


def stage(daemon: Daemon, *, kind: str = "dir") -> Stage:
    tag = uuid.uuid4().hex[:10]
    area = daemon.workspace / f"race-{tag}"
    outside = daemon.root / f"outside-{tag}"
    area.mkdir()
    outside.mkdir()
    st = Stage(area, area.name, outside)
    if kind == "dir":
        for where, text in ((st.inside, INSIDE), (st.target, SECRET)):
            where.mkdir()
            (where / "f.txt").write_text(f"{text}\n")
            (where / f"only-{'in' if text == INSIDE else 'out'}side.txt").write_text(text)
            _database(where / "db.sqlite", text)
    else:  # the file itself is swapped
        st.inside.write_text(f"{INSIDE}\n")
        st.target.write_text(f"{SECRET}\n")
    (area / "d.swap").symlink_to(st.target)
    return st


def _database(path: Path, value: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE secret(value TEXT)")
    conn.execute("INSERT INTO secret VALUES (?)", (value,))
    conn.commit()
    conn.close()


def snapshot(top: Path) -> dict[str, str]:
    """Every name under `top` with a hash of its content: what "unchanged" compares."""
    found = {}
    for path in sorted(top.rglob("*")):
        rel = str(path.relative_to(top))
        if path.is_symlink() or not path.is_file():
            found[rel] = "dir" if path.is_dir() else "link"
        else:
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@dataclass
class Tally:
    served: int = 0
    refused: int = 0
    escapes: int = 0
    # A write whose COMMIT failed (its WAL refused mid-commit) cannot prove it did
    # not commit: UNKNOWN_OUTCOME is then the honest answer, for writers only.
    writes: bool = False

    def add(self, out: Outcome, escaped: bool) -> None:
        if escaped:
            self.escapes += 1
        if out.status is Status.SUCCESS:
            self.served += 1
        elif self.writes and out.status is Status.UNKNOWN_OUTCOME:
            assert "COMMIT failed" in out.message, out.message
            self.refused += 1
        else:
            assert out.status in (Status.FAILURE, Status.REJECTED), out
            # SQLite reports some opens the walk refused mid-statement as an I/O error of
            # its own (the statement failed before anything was written): typed all the same.
            typed = ("permission_denied", "not_found", "invalid_argument", "io_error")
            assert out.error_class in typed, out.message
            self.refused += 1

    def check(self, rounds: int) -> None:
        assert self.escapes == 0, f"{self.escapes} of {rounds} calls escaped the workspace"
        # The race was real: the calls met both states of the swapped name.
        assert self.served > 0, self
        assert self.refused > 0, self


def race(
    eg: Client, st: Stage, make: Callable[[int], Call], rounds: int, *, writes: bool = False
) -> Tally:
    """`rounds` calls under the swapping loop, and more (up to 10x) until the calls met
    both states of the swapped name: on a busy machine the swapper may lose every race
    of the first `rounds`, and a race never run proves nothing."""
    tally = Tally(writes=writes)
    sent = 0
    with st.swapper():
        while sent < rounds or (not (tally.served and tally.refused) and sent < 10 * rounds):
            calls = [make(i) for i in range(sent, sent + BATCH)]
            sent += len(calls)
            for out in eg.execute(calls):
                tally.add(out, SECRET in out.text or SECRET in json.dumps(out.structured))
    return tally


ROUNDS = race_rounds(200)


# ---------------------------------------------------------------- reading tools


def test_read_file_through_a_swapped_directory(eg: Client, daemon: Daemon) -> None:
    st = stage(daemon)
    tally = race(
        eg, st, lambda i: Call(tool="read_file", arguments={"path": st.arg("f.txt")}), ROUNDS
    )
    tally.check(ROUNDS)


def test_read_file_of_a_swapped_file(eg: Client, daemon: Daemon) -> None:
    st = stage(daemon, kind="file")
    tally = race(eg, st, lambda i: Call(tool="read_file", arguments={"path": st.arg()}), ROUNDS)
    tally.check(ROUNDS)


@pytest.mark.parametrize("where", ["dir", "file", "parent"])
def test_search_under_a_swap(eg: Client, daemon: Daemon, where: str) -> None:
    st = stage(daemon)
    path = {"dir": st.arg(), "file": st.arg("f.txt"), "parent": st.rel}[where]
    pattern = f"{INSIDE}|{SECRET}"
    tally = Tally()
    with st.swapper():
        for _ in range(0, ROUNDS, BATCH):
            calls = [Call(tool="search", arguments={"pattern": pattern, "path": path})] * BATCH
            for out in eg.execute(calls):
                tally.escapes += SECRET in out.text
                if where == "parent":
                    # Both names are always there; which one is the real directory
                    # (searched) and which the symlink (skipped) tells the two states.
                    assert out.status is Status.SUCCESS, out
                    tally.served += f"{st.rel}/d/f.txt:" in out.text
                    tally.refused += f"{st.rel}/d.swap/f.txt:" in out.text
                elif out.status is Status.SUCCESS and INSIDE in out.text:
                    tally.served += 1
                else:
                    tally.refused += 1
    tally.check(ROUNDS)


def test_list_dir_of_a_swapped_directory(eg: Client, daemon: Daemon) -> None:
    st = stage(daemon)
    tally = race(eg, st, lambda i: Call(tool="list_dir", arguments={"path": st.arg()}), ROUNDS)
    tally.check(ROUNDS)
    with st.swapper():
        for out in eg.execute([Call(tool="list_dir", arguments={"path": st.arg()})] * BATCH):
            assert "only-outside.txt" not in out.text, out


def test_sql_read_through_a_swapped_directory(eg: Client, daemon: Daemon) -> None:
    st = stage(daemon)
    query = {"database": st.arg("db.sqlite"), "query": "SELECT value FROM secret"}
    tally = race(eg, st, lambda i: Call(tool="sql", arguments=query), ROUNDS)
    tally.check(ROUNDS)


# ---------------------------------------------------------------- writing tools


def _unchanged_outside(eg: Client, st: Stage, make: Callable[[int], Call]) -> Tally:
    before = snapshot(st.outside)
    tally = race(eg, st, make, ROUNDS, writes=True)
    assert snapshot(st.outside) == before, "something outside the workspace was created or changed"
    return tally


def test_write_file_with_create_dirs_through_a_swapped_directory(
    eg: Client, daemon: Daemon
) -> None:
    st = stage(daemon)
    tally = _unchanged_outside(
        eg,
        st,
        lambda i: Call(
            tool="write_file", arguments={"path": st.arg(f"new{i}", "x.txt"), "content": "w"}
        ),
    )
    tally.check(ROUNDS)


def test_write_file_through_a_swapped_directory(eg: Client, daemon: Daemon) -> None:
    st = stage(daemon)
    tally = _unchanged_outside(
        eg,
        st,
        lambda i: Call(tool="write_file", arguments={"path": st.arg(f"w{i}.txt"), "content": "w"}),
    )
    tally.check(ROUNDS)


def test_edit_file_through_a_swapped_directory(eg: Client, daemon: Daemon) -> None:
    st = stage(daemon)
    for i in range(ROUNDS):
        (st.inside / f"e{i}.txt").write_text(f"{INSIDE}\n")
        (st.target / f"e{i}.txt").write_text(f"{SECRET}\n")
    tally = _unchanged_outside(
        eg,
        st,
        lambda i: Call(
            tool="edit_file",
            arguments={"path": st.arg(f"e{i}.txt"), "old_string": "\n", "new_string": " edited\n"},
        ),
    )
    tally.check(ROUNDS)


def test_sql_create_through_a_swapped_directory(eg: Client, daemon: Daemon) -> None:
    st = stage(daemon)
    tally = _unchanged_outside(
        eg,
        st,
        lambda i: Call(
            tool="sql",
            arguments={
                "database": st.arg(f"new{i}.db"),
                "query": "CREATE TABLE t(x)",
                "create": True,
            },
        ),
    )
    tally.check(ROUNDS)


def test_sql_write_through_a_swapped_directory(eg: Client, daemon: Daemon) -> None:
    st = stage(daemon)
    tally = _unchanged_outside(
        eg,
        st,
        lambda i: Call(
            tool="sql",
            arguments={
                "database": st.arg("db.sqlite"),
                "query": f"INSERT INTO secret VALUES ('w{i}')",
            },
        ),
    )
    tally.check(ROUNDS)


# ---------------------------------------------------------------- a command's declared writes


def test_run_command_declaring_a_swapped_directory_never_writes_outside(
    eg: Client, daemon: Daemon
) -> None:
    """`writes: [d/]` while d trades places with a symlink out: the declared path is
    resolved at validation, again under the call's locks, and opened beneath the
    workspace with no symlink followed for bwrap's --bind-fd; the command only ever
    writes the real d (or fails). Refusals come in more kinds here: the sandbox refusing
    a path swapped since its last check, or the command's write failing (a mount the
    swap detached) -- each typed, none an escape."""
    st = stage(daemon)
    before = snapshot(st.outside)
    served = refused = sent = 0
    with st.swapper():
        while sent < ROUNDS or (not (served and refused) and sent < 10 * ROUNDS):
            calls = [
                Call(
                    tool="run_command",
                    arguments={
                        "argv": ["sh", "-c", f"echo {SECRET}-{i} > {st.arg('f.txt')}"],
                        "writes": [st.arg()],
                    },
                )
                for i in range(sent, sent + BATCH)
            ]
            sent += len(calls)
            for out in eg.execute(calls):
                if out.status is Status.SUCCESS:
                    served += 1
                    continue
                assert out.status in (Status.FAILURE, Status.REJECTED), (out.status, out.message)
                typed = ("permission_denied", "not_found", "sandbox_error", "nonzero_exit")
                assert out.error_class in typed, (out.error_class, out.message, out.text)
                refused += 1
    assert snapshot(st.outside) == before, "something outside the workspace was created or changed"
    assert served > 0
    assert refused > 0
