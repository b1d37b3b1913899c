"""The resource-dependency scheduler, end to end through real daemons (no mocks).

Reads of a resource run together; conflicting calls (same resource, at least one
write) never overlap and run in proposal order -- within a batch, across client
connections, and across daemons sharing a workspace (filelock backend). Every
claim is checked on what the daemon reports: outcome timelines (lock_granted,
started, finished marks), WAITING events, the values the `work` probe read, and
the files it left behind. `--locks none` shows the lost updates otherwise.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execgate.client import Call, Client, Event, EventKind, Outcome, Status
from tests.daemon import Daemon

# -- helpers ---------------------------------------------------------------------------


def new_run() -> str:
    """A fresh run id: call ids may then repeat across tests on the shared daemon."""
    return "sched-" + uuid.uuid4().hex[:12]


def root_of(d: Daemon) -> str:
    """The workspace root as the daemon renders keys (resolved, like Workspace does)."""
    return os.path.realpath(d.workspace)


def work(path: str, *, write: bool = False, seconds: float = 0.0, call_id: str = "") -> Call:
    args: dict[str, Any] = {"path": path, "write": write, "seconds": seconds}
    return Call(tool="work", arguments=args, call_id=call_id)


def at(outcome: Outcome, phase: str) -> float:
    found = outcome.mark(phase)
    assert found is not None, f"{outcome.call_id} has no {phase!r} mark: {outcome.timeline}"
    return found.at


def span(outcome: Outcome) -> tuple[float, float]:
    """[started, finished] of a call that ran."""
    assert outcome.status is Status.SUCCESS, (outcome.call_id, outcome.status, outcome.message)
    return at(outcome, "started"), at(outcome, "finished")


def overlap(a: Outcome, b: Outcome) -> bool:
    (s1, f1), (s2, f2) = span(a), span(b)
    return s1 < f2 and s2 < f1


def value(outcome: Outcome) -> int:
    """What a `work` call read from its counter (the probe prints it)."""
    assert outcome.status is Status.SUCCESS, (outcome.call_id, outcome.message)
    return int(outcome.text.strip())


def counter(path: Path) -> int:
    return int(path.read_text().strip()) if path.exists() else 0


@dataclass
class Streamed:
    """Every event of one `client.stream` batch, with lookups by call id."""

    events: list[Event]

    def outcome(self, call_id: str) -> Outcome:
        for e in self.events:
            if e.kind is EventKind.FINISHED and e.call_id == call_id:
                assert e.outcome is not None
                return e.outcome
        raise AssertionError(f"no FINISHED event for {call_id}")

    def waiting(self, call_id: str) -> list[Event]:
        return [e for e in self.events if e.kind is EventKind.WAITING and e.call_id == call_id]


def stream(client: Client, calls: list[Call], run: str) -> Streamed:
    return Streamed(list(client.stream(calls, run_id=run)))


def assert_serial(outcomes: list[Outcome]) -> None:
    """No two of these calls ran at the same time (each started after the previous ended)."""
    ordered = sorted(outcomes, key=lambda o: at(o, "started"))
    for before, after in itertools.pairwise(ordered):
        assert at(after, "started") >= at(before, "finished"), (
            f"{after.call_id} started while {before.call_id} ran"
        )


def increments(
    address: str, path: str, seconds: float, *, clients: int, each: int
) -> list[Outcome]:
    """`clients` connections (one thread and one Client each) send `each` increments.

    A barrier lines the connections up before every round, so their calls arrive
    together: without a scheduler they would overlap.
    """
    barrier = threading.Barrier(clients)

    def one_client() -> list[Outcome]:
        out = []
        try:
            with Client(address) as c:
                for _ in range(each):
                    barrier.wait(timeout=30)
                    out.append(c.run(work(path, write=True, seconds=seconds)))
        except BaseException:
            barrier.abort()  # the others must not wait for a round that never comes
            raise
        return out

    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(one_client) for _ in range(clients)]
        return [o for f in futures for o in f.result(timeout=60)]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start more daemons for one test (own root each); all stopped afterwards."""
    started: list[Daemon] = []

    def start(name: str, *args: str, workspace: Path | None = None) -> Daemon:
        root = tmp_path / name
        root.mkdir()
        d = Daemon(root, *args)
        if workspace is not None:
            d.workspace = workspace  # Daemon.start passes it as --workspace
        started.append(d)
        return d.start()

    yield start
    for d in started:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


# -- 1. the seed case -------------------------------------------------------------------


def test_two_writes_to_one_file_in_a_batch_run_one_after_the_other(
    shared: Daemon, eg: Client
) -> None:
    run = new_run()
    calls = [
        Call(tool="write_file", arguments={"path": "seed.txt", "content": "first"}, call_id="w1"),
        Call(tool="write_file", arguments={"path": "seed.txt", "content": "second"}, call_id="w2"),
    ]
    got = stream(eg, calls, run)
    w1, w2 = got.outcome("w1"), got.outcome("w2")

    assert at(w2, "started") >= at(w1, "finished")
    assert (shared.workspace / "seed.txt").read_text() == "second"
    assert got.waiting("w1") == []
    [waiting] = got.waiting("w2")
    assert waiting.keys == (f"file:{root_of(shared)}/seed.txt",)
    assert waiting.blocked_by == (f"{run}/w1",)
    # The wait is in the timeline too, before the grant.
    assert at(w2, "queued") <= at(w2, "waiting") <= at(w2, "lock_granted") <= at(w2, "started")


# -- 2. lost updates: prevented with the scheduler, shown without it ------------------------


def test_concurrent_increments_from_four_clients_lose_nothing(shared: Daemon) -> None:
    outcomes = increments(shared.address, "inc-locked", 0.05, clients=4, each=5)

    assert counter(shared.workspace / "inc-locked") == 20
    # Every increment saw a different counter: each read what the previous one wrote.
    assert sorted(value(o) for o in outcomes) == list(range(20))
    assert_serial(outcomes)


def test_without_the_scheduler_the_same_increments_lose_updates(
    spawn: Callable[..., Daemon],
) -> None:
    racy = spawn("nolocks", "--locks", "none")

    outcomes = increments(racy.address, "inc-racy", 0.2, clients=4, each=5)

    assert all(o.status is Status.SUCCESS for o in outcomes)
    assert counter(racy.workspace / "inc-racy") < 20
    # Several calls read the same counter: their writes overwrote each other.
    assert len({value(o) for o in outcomes}) < 20


# -- 3. reads together; writers of a tree or the workspace against readers inside it ------


def test_reads_run_together(shared: Daemon, eg: Client) -> None:
    begin = time.monotonic()
    r1, r2, r3 = eg.execute(
        [work("rt-a", seconds=0.5), work("rt-b", seconds=0.5), work("rt-a", seconds=0.5)],
        run_id=new_run(),
    )
    wall = time.monotonic() - begin

    assert overlap(r1, r2)
    assert overlap(r1, r3)  # two readers of the same file share it too
    assert overlap(r2, r3)
    assert wall < 0.9, f"three 0.5 s reads took {wall:.2f} s: they did not run together"


def test_a_workspace_writer_waits_for_a_reader_and_holds_back_later_readers(
    shared: Daemon, eg: Client
) -> None:
    run = new_run()
    (shared.workspace / "wsdir").mkdir()
    (shared.workspace / "wsdir" / "a").write_text("3\n")
    calls = [
        work("wsdir/a", seconds=0.5, call_id="r1"),
        Call(
            tool="run_command", arguments={"argv": ["sh", "-c", "echo 7 > wsdir/a"]}, call_id="rc"
        ),
        work("wsdir/a", call_id="r2"),
    ]
    got = stream(eg, calls, run)
    r1, rc, r2 = got.outcome("r1"), got.outcome("rc"), got.outcome("r2")

    # run_command writes the whole workspace: X on its root meets r1's IS there.
    assert at(rc, "started") >= at(r1, "finished")
    [rc_wait] = got.waiting("rc")
    assert rc_wait.keys == ("workspace",)
    assert rc_wait.blocked_by == (f"{run}/r1",)
    # r2 could share dir/a with r1, but it was proposed after the writer: it waits
    # for the writer (FIFO per conflict; the writer does not starve).
    assert at(r2, "started") >= at(rc, "finished")
    [r2_wait] = got.waiting("r2")
    assert r2_wait.keys == ("workspace",)
    assert r2_wait.blocked_by == (f"{run}/rc",)
    # Proposal order is what each call saw.
    assert value(r1) == 3
    assert value(r2) == 7


def test_a_tree_reader_holds_back_a_write_inside_the_tree(shared: Daemon, eg: Client) -> None:
    run = new_run()
    (shared.workspace / "ld").mkdir()
    (shared.workspace / "ld" / "old.txt").write_text("x")
    calls = [
        Call(tool="list_dir", arguments={"path": "ld"}, call_id="ls"),
        Call(tool="write_file", arguments={"path": "ld/new.txt", "content": "y"}, call_id="w"),
    ]
    got = stream(eg, calls, run)
    ls, w = got.outcome("ls"), got.outcome("w")

    assert at(w, "started") >= at(ls, "finished")
    [waiting] = got.waiting("w")
    # S on the directory meets the write's IX there.
    assert waiting.keys == (f"file:{root_of(shared)}/ld",)
    assert waiting.blocked_by == (f"{run}/ls",)
    assert ls.text.splitlines() == ["old.txt"]  # listed before the write, as proposed
    assert (shared.workspace / "ld" / "new.txt").read_text() == "y"


def test_a_tree_reader_does_not_hold_back_a_write_outside_it(shared: Daemon, eg: Client) -> None:
    run = new_run()
    tree = shared.workspace / "st"
    tree.mkdir()
    # About half a second of searching, so the write has time to run inside it.
    (tree / "big.txt").write_text("the quick brown fox\n" * 200_000)
    calls = [
        Call(tool="search", arguments={"path": "st", "pattern": "zzz"}, call_id="s"),
        Call(tool="write_file", arguments={"path": "outside.txt", "content": "z"}, call_id="w"),
        Call(tool="write_file", arguments={"path": "st/inside.txt", "content": "z"}, call_id="wi"),
    ]
    got = stream(eg, calls, run)
    s, w, wi = got.outcome("s"), got.outcome("w"), got.outcome("wi")

    assert got.waiting("w") == []
    assert overlap(s, w), "a write outside the searched tree waited for the search"
    # The control: the write inside the tree did wait for the search.
    [waiting] = got.waiting("wi")
    assert waiting.blocked_by == (f"{run}/s",)
    assert at(wi, "started") >= at(s, "finished")


# -- 4. sql: table keys ---------------------------------------------------------------------


@dataclass(frozen=True)
class SlowSql:
    """A database `sq.db` with tables a and b, and statements calibrated to be slow."""

    database: str
    path: str  # absolute, as keys render it
    rows: int  # recursion depth of the slow statements

    def _cte(self) -> str:
        return (
            "WITH RECURSIVE c(x) AS "
            f"(SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {self.rows}) "
        )

    def read(self, table: str, call_id: str) -> Call:
        # The cost does not grow with the table: writes keep adding rows to it.
        query = self._cte() + f"SELECT (SELECT count(*) FROM {table}) + count(*) FROM c"
        return self.call(query, call_id)

    def write(self, table: str, call_id: str) -> Call:
        query = f"INSERT INTO {table} SELECT count(*) FROM ({self._cte()}SELECT x FROM c)"
        return self.call(query, call_id)

    def call(self, query: str, call_id: str = "") -> Call:
        args = {"database": self.database, "query": query}
        return Call(tool="sql", arguments=args, call_id=call_id)

    def key(self, table: str) -> str:
        return f"table:{self.path}/{table}"


@pytest.fixture(scope="module")
def slow_sql(shared: Daemon, eg: Client) -> SlowSql:
    """Create the database through the daemon, then size the slow statements (~0.4 s)."""
    db = SlowSql("sq.db", os.path.join(root_of(shared), "sq.db"), 200_000)
    create = (
        "CREATE TABLE a (x INTEGER); CREATE TABLE b (x INTEGER); "
        "INSERT INTO a VALUES (1); INSERT INTO b VALUES (1)"
    )
    made = eg.run(
        Call(tool="sql", arguments={"database": db.database, "query": create, "create": True})
    )
    assert made.status is Status.SUCCESS, made.message
    took = min(
        at(o, "finished") - at(o, "started")
        for o in (eg.run(db.read("a", "")), eg.run(db.read("a", "")))
    )
    rows = int(db.rows * 0.4 / max(took, 0.005))
    return SlowSql(db.database, db.path, max(200_000, min(rows, 20_000_000)))


def test_sql_writes_to_one_table_run_one_after_the_other(eg: Client, slow_sql: SlowSql) -> None:
    run = new_run()
    got = stream(eg, [slow_sql.write("a", "s1"), slow_sql.write("a", "s2")], run)
    s1, s2 = got.outcome("s1"), got.outcome("s2")

    assert at(s2, "started") >= at(s1, "finished")
    [waiting] = got.waiting("s2")
    assert waiting.keys == (slow_sql.key("a"),)
    assert waiting.blocked_by == (f"{run}/s1",)
    assert s1.structured["writes"] == s2.structured["writes"] == ["a"]


def test_sql_writes_to_different_tables_are_not_held_apart(eg: Client, slow_sql: SlowSql) -> None:
    # SQLite itself lets one writer at a time into a database file, so the second
    # statement may wait inside SQLite; what the scheduler owes is to start both.
    got = stream(eg, [slow_sql.write("a", "sa"), slow_sql.write("b", "sb")], new_run())
    sa, sb = got.outcome("sa"), got.outcome("sb")

    assert [e for e in got.events if e.kind is EventKind.WAITING] == []
    first_end = min(at(sa, "finished"), at(sb, "finished"))
    assert max(at(sa, "lock_granted"), at(sb, "lock_granted")) < first_end
    assert max(at(sa, "started"), at(sb, "started")) < first_end
    assert sa.status is sb.status is Status.SUCCESS


def test_sql_reads_of_one_table_run_together_and_a_write_waits_for_both(
    eg: Client, slow_sql: SlowSql
) -> None:
    run = new_run()
    calls = [slow_sql.read("a", "r1"), slow_sql.read("a", "r2"), slow_sql.write("a", "w")]
    got = stream(eg, calls, run)
    r1, r2, w = got.outcome("r1"), got.outcome("r2"), got.outcome("w")

    assert got.waiting("r1") == got.waiting("r2") == []
    assert overlap(r1, r2)
    assert r1.structured["reads"] == ["a"]
    assert r1.structured["writes"] == []
    [waiting] = got.waiting("w")
    assert waiting.keys == (slow_sql.key("a"),)
    assert set(waiting.blocked_by) == {f"{run}/r1", f"{run}/r2"}
    assert at(w, "started") >= max(at(r1, "finished"), at(r2, "finished"))


def test_sql_reader_and_writer_of_different_tables_both_succeed(
    eg: Client, slow_sql: SlowSql
) -> None:
    """The database was created by the tool, so in WAL mode: a reader never blocks a COMMIT."""
    run = new_run()
    calls = [slow_sql.read("a", "r"), slow_sql.write("b", "w")]
    got = stream(eg, calls, run)
    r, w = got.outcome("r"), got.outcome("w")
    assert (r.status, w.status) == (Status.SUCCESS, Status.SUCCESS), (r.message, w.message)
    assert got.waiting("w") == []
    assert overlap(r, w)


# -- 5. property: any batch of reads and writes behaves as if run in proposal order --------

_examples = itertools.count()


@settings(max_examples=15, deadline=None)
@given(
    batch=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2),  # which file
            st.booleans(),  # write?
            st.sampled_from([0, 0.01, 0.02, 0.03]),  # seconds
        ),
        min_size=4,
        max_size=8,
    )
)
def test_random_batches_keep_conflicts_apart_and_in_order(
    shared: Daemon, eg: Client, batch: list[tuple[int, bool, float]]
) -> None:
    n = next(_examples)
    files = [f"prop{n}-{i}" for i in range(3)]
    calls = [
        work(files[f], write=write, seconds=seconds, call_id=f"c{i}")
        for i, (f, write, seconds) in enumerate(batch)
    ]
    outcomes = eg.execute(calls, run_id=new_run())

    for j, (fj, wj, _) in enumerate(batch):
        for i, (fi, wi, _) in enumerate(batch[:j]):
            if fi != fj or not (wi or wj):
                continue
            earlier, later = outcomes[i], outcomes[j]
            # (a) conflicting calls never overlap; (b) the earlier proposal went first.
            assert not overlap(earlier, later), f"c{i} and c{j} ran at the same time"
            assert at(earlier, "started") < at(later, "started"), f"c{j} started before c{i}"
    for i, (f, _, _) in enumerate(batch):
        # (d) every call, read or write, saw exactly the writes proposed before it.
        before = sum(1 for g, w, _ in batch[:i] if g == f and w)
        assert value(outcomes[i]) == before, f"c{i} read {outcomes[i].text!r}, expected {before}"
    for f, name in enumerate(files):
        # (c) no write was lost.
        writes = sum(1 for g, w, _ in batch if g == f and w)
        assert counter(shared.workspace / name) == writes


# -- 6. two daemons, one workspace: the filelock backend ---------------------------------


def test_two_daemons_on_one_workspace_serialize_conflicting_writes(
    tmp_path: Path, spawn: Callable[..., Daemon]
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    locks = ["--locks", "filelock", "--lock-dir", str(tmp_path / "locks")]
    d1 = spawn("d1", *locks, workspace=workspace)
    d2 = spawn("d2", *locks, workspace=workspace)
    assert d1.state_dir != d2.state_dir

    def ten_increments(d: Daemon) -> list[Outcome]:
        with Client(d.address) as c:
            calls = [work("shared-counter", write=True, seconds=0.05) for _ in range(10)]
            return c.execute(calls, run_id=new_run())

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(ten_increments, d) for d in (d1, d2)]
        one, two = (f.result(timeout=60) for f in futures)

    # A call that failed (and wrote nothing) is told apart from a lost write.
    failed = [(o.call_id, o.status, o.error_class, o.message) for o in one + two if not o.ok]
    assert failed == []
    assert counter(workspace / "shared-counter") == 20
    assert sorted(value(o) for o in one + two) == list(range(20))
    assert_serial(one + two)
    for a in one:  # said once more, the way the issue puts it
        for b in two:
            assert not overlap(a, b), f"{a.call_id} (d1) and {b.call_id} (d2) overlapped"


# -- 7. Explain ---------------------------------------------------------------------------------


def test_explain_shows_the_plan_and_runs_nothing(shared: Daemon, eg: Client) -> None:
    run = new_run()
    ws = root_of(shared)
    with closing(sqlite3.connect(shared.workspace / "ex.db")) as conn, conn:
        # WAL: readers never block a COMMIT, so table-level locks are enough.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript("CREATE TABLE a (x INTEGER); CREATE TABLE b (x INTEGER);")
    with closing(sqlite3.connect(shared.workspace / "ex-rollback.db")) as conn, conn:
        conn.executescript("CREATE TABLE a (x INTEGER); CREATE TABLE b (x INTEGER);")
    calls = [
        work("ex-a", call_id="r1"),
        work("ex-a", write=True, call_id="w1"),
        work("ex-b", call_id="rb"),
        work("ex-a", write=True, call_id="w2"),
        Call(tool="work", arguments={"path": "ex-a", "bogus": 1}, call_id="bad"),
        Call(tool="work", arguments={"path": "../outside"}, call_id="escape"),
        Call(
            tool="sql",
            arguments={"database": "ex.db", "query": "INSERT INTO a SELECT x FROM b"},
            call_id="q",
        ),
        Call(
            tool="sql",
            arguments={"database": "ex-new.db", "query": "CREATE TABLE t (x)", "create": True},
            call_id="mk",
        ),
        Call(tool="write_file", arguments={"path": "ex-new.txt", "content": "x"}, call_id="wf"),
        Call(
            tool="sql",
            arguments={"database": "ex-rollback.db", "query": "INSERT INTO a SELECT x FROM b"},
            call_id="qr",
        ),
    ]
    plans = {p.call_id: p for p in eg.explain(calls, run_id=run)}
    assert [p.call_id for p in eg.explain(calls, run_id=run)] == [c.call_id for c in calls]

    a, b = f"file:{ws}/ex-a", f"file:{ws}/ex-b"
    r1, w1, rb, w2 = plans["r1"], plans["w1"], plans["rb"], plans["w2"]
    assert r1.waits_for == ()
    assert w1.waits_for == ("r1",)
    assert rb.waits_for == ()
    assert w2.waits_for == ("r1", "w1")
    assert r1.claims == ((a, "read"),)
    assert w1.claims == ((a, "write"),)
    assert not r1.may_write
    assert w1.may_write
    assert r1.locks == (("workspace", "IS"), (a, "S"))
    assert rb.locks == (("workspace", "IS"), (b, "S"))
    assert w1.locks == w2.locks == (("workspace", "IX"), (a, "X"))
    for p in (r1, w1, rb, w2):
        assert p.rejected is None

    for call_id, error_class in (("bad", "invalid_argument"), ("escape", "permission_denied")):
        p = plans[call_id]
        assert p.rejected is not None, call_id
        assert p.rejected.status is Status.REJECTED
        assert p.rejected.error_class == error_class
        assert p.claims == p.locks == p.waits_for == ()

    q = plans["q"]
    db = f"{ws}/ex.db"
    assert set(q.claims) == {(f"table:{db}/a", "write"), (f"table:{db}/b", "read")}
    assert set(q.locks) == {
        ("workspace", "IX"),
        (f"file:{db}", "IX"),
        (f"table:{db}/a", "X"),
        (f"table:{db}/b", "S"),
    }
    assert q.waits_for == ()
    # Outside WAL mode SQLite cannot commit while anyone reads: a writer takes the file.
    assert plans["qr"].claims == ((f"file:{ws}/ex-rollback.db", "write"),)
    assert plans["qr"].may_write
    assert plans["mk"].rejected is None
    assert plans["wf"].locks == (("workspace", "IX"), (f"file:{ws}/ex-new.txt", "X"))

    # Nothing ran: no file, no database, no row, no journal entry.
    for name in ("ex-a", "ex-b", "ex-new.db", "ex-new.txt"):
        assert not (shared.workspace / name).exists(), name
    with closing(sqlite3.connect(shared.workspace / "ex.db")) as conn:
        assert conn.execute("SELECT count(*) FROM a").fetchone() == (0,)
    assert eg.list_calls(run_id=run) == []
