"""The built-in `sql` tool, run directly (no daemon) on real SQLite files."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Phase, Status, StopMode
from execgate.executor.core.paths import Workspace
from execgate.executor.pipeline import results
from execgate.executor.tools import Mode, ResourceKind, builtin_tools, sqlexec
from execgate.executor.tools.base import CancelScope, Limits, ToolContext, ToolOutput
from execgate.executor.tools.sql import Sql, SqlCallEffects
from execgate.executor.tools.sqlanalysis import SqlEffects

# Counts to a billion: minutes of work, unless it is stopped.
ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1e9) "


def sql(db: Path, query: str) -> list[tuple[Any, ...]]:
    """Run `query` on `db` outside the tool (setup and checks)."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        return conn.execute(query).fetchall() if ";" not in query else _script(conn, query)


def _script(conn: sqlite3.Connection, query: str) -> list[tuple[Any, ...]]:
    conn.executescript(query)
    return []


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    sql(
        root / "app.db",
        "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, data BLOB);"
        "INSERT INTO t VALUES (1, 'one', NULL), (2, 'two', x'00ff'), (3, 'th\tree', NULL);"
        "CREATE TABLE u (id INTEGER PRIMARY KEY, t_id INTEGER);",
    )
    return root


def ctx_for(root: Path, timeout: float = 10.0) -> ToolContext:
    return ToolContext(Workspace(root), Limits(), timeout, CancelScope())


def run(root: Path, args: dict[str, Any], timeout: float = 10.0) -> ToolOutput:
    args = {"database": "app.db", **args}
    return asyncio.run(Sql().run(args, ctx_for(root, timeout)))


def fails(root: Path, args: dict[str, Any]) -> ToolError:
    with pytest.raises(ToolError) as info:
        run(root, args)
    return info.value


def names(root: Path) -> list[str]:
    return [r[0] for r in sql(root / "app.db", "SELECT name FROM t ORDER BY id")]


# -- results ---------------------------------------------------------------------------


def test_select_is_a_tab_separated_table(ws: Path) -> None:
    out = run(ws, {"query": "SELECT id, name, data FROM t ORDER BY id"})
    assert out.text.splitlines() == [
        "id\tname\tdata",
        "1\tone\tNULL",
        "2\ttwo\tx'00ff'",
        "3\tth\\tree\tNULL",
    ]
    assert out.structured["columns"] == ["id", "name", "data"]
    assert out.structured["rows"][1] == [2, "two", {"hex": "00ff"}]
    assert out.structured["reads"] == ["t"]
    assert out.structured["writes"] == []
    assert out.error_class is ErrorClass.NONE
    assert not out.truncated
    assert out.evidence.path == str(ws / "app.db")


def test_insert_update_delete_report_rows_changed(ws: Path) -> None:
    out = run(ws, {"query": "INSERT INTO t (name) VALUES ('four'), ('five')"})
    assert out.text == "2 row(s) changed"
    assert out.structured["rows_changed"] == 2
    assert out.structured["writes"] == ["t"]
    assert run(ws, {"query": "UPDATE t SET name = upper(name) WHERE id > 3"}).text == (
        "2 row(s) changed"
    )
    assert run(ws, {"query": "DELETE FROM t WHERE id = 1"}).structured["rows_changed"] == 1
    assert names(ws) == ["two", "th\tree", "FOUR", "FIVE"]


def test_insert_returning_gives_rows_and_changes(ws: Path) -> None:
    out = run(ws, {"query": "INSERT INTO t (name) VALUES ('x') RETURNING id, name"})
    assert out.text == "id\tname\n4\tx\n1 row(s) changed"


def test_ddl(ws: Path) -> None:
    out = run(
        ws, {"query": "CREATE TABLE n (x); CREATE INDEX n_x ON n (x); INSERT INTO n VALUES (1)"}
    )
    assert out.structured["statements"] == 3
    assert out.structured["writes"] == ["n"]
    assert sql(ws / "app.db", "SELECT x FROM n") == [(1,)]
    assert run(ws, {"query": "DROP TABLE n"}).text == "0 row(s) changed"
    assert sql(ws / "app.db", "SELECT count(*) FROM sqlite_master WHERE name = 'n'") == [(0,)]


def test_params_positional_named_and_blob(ws: Path) -> None:
    out = run(ws, {"query": "SELECT name FROM t WHERE id > ? AND id < ?", "params": [1, 3]})
    assert out.structured["rows"] == [["two"]]
    out = run(ws, {"query": "SELECT name FROM t WHERE id = :id", "params": {"id": 3}})
    assert out.structured["rows"] == [["th\tree"]]
    run(ws, {"query": "INSERT INTO t VALUES (?, ?, ?)", "params": [9, None, {"hex": "cafe"}]})
    assert sql(ws / "app.db", "SELECT data FROM t WHERE id = 9") == [(b"\xca\xfe",)]


def test_params_need_a_single_statement(ws: Path) -> None:
    err = fails(ws, {"query": "SELECT ?; SELECT 2", "params": [1]})
    assert (err.status, err.error_class, err.field) == (
        Status.REJECTED,
        ErrorClass.INVALID_ARGUMENT,
        "arguments.params",
    )


def test_wrong_number_of_params(ws: Path) -> None:
    err = fails(ws, {"query": "SELECT ? + ?", "params": [1]})
    assert (err.error_class, err.field) == (ErrorClass.INVALID_ARGUMENT, "arguments.params")


def test_sql_error_carries_sqlites_message(ws: Path) -> None:
    err = fails(ws, {"query": "SELECT nope FROM t"})
    assert err.error_class is ErrorClass.INVALID_ARGUMENT
    assert "no such column: nope" in err.message


# -- all or nothing --------------------------------------------------------------------


def test_multi_statement_write_is_atomic(ws: Path) -> None:
    err = fails(
        ws, {"query": "INSERT INTO t (name) VALUES ('new'); INSERT INTO missing VALUES (1)"}
    )
    assert err.error_class is ErrorClass.INVALID_ARGUMENT
    assert err.message.startswith("statement 2:")
    assert names(ws) == ["one", "two", "th\tree"]


def test_constraint_violation_rolls_back_earlier_statements(ws: Path) -> None:
    query = "UPDATE t SET name = 'changed'; INSERT INTO t (id) VALUES (1)"
    err = fails(ws, {"query": query})
    assert "UNIQUE constraint failed" in err.message
    assert names(ws) == ["one", "two", "th\tree"]


@pytest.mark.parametrize(
    "query",
    [
        "BEGIN; INSERT INTO t (name) VALUES ('x'); COMMIT",
        "INSERT INTO t (name) VALUES ('x'); COMMIT; INSERT INTO missing VALUES (1)",
        "SAVEPOINT s; INSERT INTO t (name) VALUES ('x'); RELEASE s",
    ],
)
def test_transaction_control_is_refused(ws: Path, query: str) -> None:
    err = fails(ws, {"query": query})
    assert err.error_class is ErrorClass.PERMISSION_DENIED
    assert "one transaction" in err.message
    assert names(ws) == ["one", "two", "th\tree"]


def test_attach_and_vacuum_into_are_refused(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.db"
    err = fails(ws, {"query": f"ATTACH '{outside}' AS o; CREATE TABLE o.x (y)"})
    assert err.error_class is ErrorClass.PERMISSION_DENIED
    fails(ws, {"query": f"VACUUM INTO '{outside}'"})
    assert not outside.exists()


def test_pragmas_introspection_only(ws: Path) -> None:
    out = run(ws, {"query": "PRAGMA table_info(t)"})
    assert [r[1] for r in out.structured["rows"]] == ["id", "name", "data"]
    run(ws, {"query": "PRAGMA user_version = 7"})
    assert sql(ws / "app.db", "PRAGMA user_version") == [(7,)]
    err = fails(ws, {"query": "PRAGMA query_only = OFF"})
    assert err.error_class is ErrorClass.PERMISSION_DENIED


# -- the analysis is binding -----------------------------------------------------------


def forged(root: Path, found: SqlEffects) -> SqlCallEffects:
    return SqlCallEffects(root / "app.db", "app.db", found)


def test_a_write_the_analysis_missed_is_refused(ws: Path) -> None:
    read_only = forged(ws, SqlEffects(frozenset({"t"}), frozenset(), None, 1))
    args = {"database": "app.db", "query": "DELETE FROM t"}
    with pytest.raises(ToolError) as info:
        asyncio.run(Sql().run(args, ctx_for(ws), effects=read_only))
    assert info.value.error_class is ErrorClass.PERMISSION_DENIED
    assert "writes table 't'" in info.value.message
    assert len(names(ws)) == 3


def test_query_only_stops_a_write_analysed_as_read(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even with the authorizer out of the way, a read-only run cannot write."""

    class AllowAll(sqlexec.Guard):
        def check(self, *args: Any) -> str | None:
            return None

    monkeypatch.setattr(sqlexec, "Guard", AllowAll)
    read_only = forged(ws, SqlEffects(frozenset({"t"}), frozenset(), None, 1))
    args = {"database": "app.db", "query": "DELETE FROM t"}
    with pytest.raises(ToolError) as info:
        asyncio.run(Sql().run(args, ctx_for(ws), effects=read_only))
    assert info.value.error_class is ErrorClass.INVALID_ARGUMENT
    assert "query_only" in info.value.message
    assert len(names(ws)) == 3


def test_a_trigger_created_after_the_analysis_is_refused(ws: Path) -> None:
    args = {"database": "app.db", "query": "INSERT INTO t (name) VALUES ('x')"}
    stale = Sql().effects(args, Workspace(ws))
    assert stale.sql.writes == {"t"}
    sql(
        ws / "app.db",
        "CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO u VALUES (NULL, 1); END;",
    )
    with pytest.raises(ToolError) as info:
        asyncio.run(Sql().run(args, ctx_for(ws), effects=stale))
    assert "writes table 'u' through 'tr'" in info.value.message
    assert sql(ws / "app.db", "SELECT count(*) FROM u") == [(0,)]
    assert len(names(ws)) == 3
    assert run(ws, {"query": args["query"]}).text == "2 row(s) changed"  # re-analysed


def test_count_over_a_cte_is_not_a_table_read(ws: Path) -> None:
    out = run(ws, {"query": "WITH c AS (SELECT 1 UNION ALL SELECT 2) SELECT count(*) FROM c"})
    assert out.structured["rows"] == [[2]]


# -- limits ----------------------------------------------------------------------------


def test_max_rows_truncates(ws: Path) -> None:
    query = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 50) "
    out = run(ws, {"query": query + "SELECT x FROM c", "max_rows": 10})
    assert out.truncated
    assert out.structured["rows"] == [[i] for i in range(1, 11)]
    exact = run(ws, {"query": query + "SELECT x FROM c WHERE x <= 10", "max_rows": 10})
    assert not exact.truncated
    outcome = results.from_output(out, may_write=False, cap=64 * 1024, marks=())
    assert outcome.status is Status.PARTIAL


def test_output_cap_truncates(ws: Path) -> None:
    query = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000) "
    out = run(ws, {"query": query + "SELECT x, printf('%.200c', 'y') FROM c", "max_rows": 10000})
    assert out.truncated
    assert 0 < len(out.structured["rows"]) < 5000


def test_cancel_stops_a_long_read_within_a_second(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = threading.Event()
    handler = sqlexec.Stop.handler

    def observed(self: sqlexec.Stop) -> int:
        running.set()  # the engine is executing the statement
        return handler(self)

    monkeypatch.setattr(sqlexec.Stop, "handler", observed)
    args = {"database": "app.db", "query": ENDLESS + "SELECT count(*) FROM c"}

    async def scenario() -> tuple[ToolOutput, float]:
        ctx = ctx_for(ws)
        task = asyncio.create_task(Sql().run(args, ctx))
        assert await asyncio.to_thread(running.wait, 5)
        ctx.cancel.cancel("x")
        start = time.monotonic()
        out = await task
        return out, time.monotonic() - start

    out, took = asyncio.run(scenario())
    assert took < 1.0
    assert (out.error_class, out.stopped_how) == (ErrorClass.CANCELLED, StopMode.COOPERATIVE)
    assert [m.phase for m in out.marks] == [Phase.CANCEL_REQUESTED, Phase.STOPPED]
    assert out.marks[0].detail == "x"
    assert out.structured["committed"] is False
    outcome = results.from_output(out, may_write=False, cap=64 * 1024, marks=())
    assert (outcome.status, outcome.error_class) == (Status.FAILURE, ErrorClass.CANCELLED)


def write_lock_held(db: Path) -> bool:
    with contextlib.closing(sqlite3.connect(db, timeout=0, isolation_level=None)) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return True
        conn.execute("ROLLBACK")
        return False


def test_cancel_rolls_back_a_long_write(ws: Path) -> None:
    args = {"database": "app.db", "query": ENDLESS + "INSERT INTO t (name) SELECT x FROM c"}

    async def scenario() -> tuple[ToolOutput, float]:
        ctx = ctx_for(ws)
        task = asyncio.create_task(Sql().run(args, ctx))
        while not await asyncio.to_thread(write_lock_held, ws / "app.db"):
            assert not task.done()
        ctx.cancel.cancel("x")
        start = time.monotonic()
        out = await task
        return out, time.monotonic() - start

    out, took = asyncio.run(scenario())
    assert took < 1.0
    assert (out.error_class, out.stopped_how) == (ErrorClass.CANCELLED, StopMode.COOPERATIVE)
    assert out.structured == {
        "committed": False,
        "statements": 1,
        "reads": [],
        "writes": ["t"],
        "whole_db": None,
    }
    assert len(names(ws)) == 3
    assert not write_lock_held(ws / "app.db")


@pytest.mark.parametrize("what", ["SELECT count(*) FROM c", "INSERT INTO t (name) SELECT x FROM c"])
def test_timeout_stops_and_rolls_back(ws: Path, what: str) -> None:
    start = time.monotonic()
    out = run(ws, {"query": ENDLESS + what}, timeout=0.3)
    assert time.monotonic() - start < 1.3
    assert (out.error_class, out.stopped_how) == (ErrorClass.TIMEOUT, StopMode.COOPERATIVE)
    assert out.message.startswith("timed out after 0.3s")
    assert len(names(ws)) == 3


def test_concurrent_writers_on_one_database_both_commit(ws: Path) -> None:
    """Table locks let writes to different tables overlap; SQLite then serializes them."""
    sql(ws / "app.db", "PRAGMA journal_mode = WAL")
    rows = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000) "

    async def both() -> list[ToolOutput]:
        calls = [
            Sql().run({"database": "app.db", "query": rows + q}, ctx_for(ws))
            for q in [
                "INSERT INTO t (name) SELECT x FROM c",
                "INSERT INTO u (t_id) SELECT x FROM c",
            ]
        ]
        return await asyncio.gather(*calls)

    outs = asyncio.run(both())
    assert [o.structured["rows_changed"] for o in outs] == [200000, 200000]
    assert sql(ws / "app.db", "SELECT (SELECT count(*) FROM t), (SELECT count(*) FROM u)") == [
        (200003, 200000)
    ]


def test_cancel_while_waiting_for_another_writer(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    polled = threading.Event()
    poll = sqlexec.Stop.poll

    def observed(self: sqlexec.Stop) -> bool:
        polled.set()  # only a busy BEGIN IMMEDIATE polls before the statements run
        return poll(self)

    monkeypatch.setattr(sqlexec.Stop, "poll", observed)
    args = {"database": "app.db", "query": "DELETE FROM t"}

    async def scenario() -> ToolOutput:
        ctx = ctx_for(ws)
        task = asyncio.create_task(Sql().run(args, ctx))
        assert await asyncio.to_thread(polled.wait, 5)
        ctx.cancel.cancel("x")
        return await task

    with contextlib.closing(sqlite3.connect(ws / "app.db", isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        out = asyncio.run(scenario())
        other.execute("ROLLBACK")
    assert (out.error_class, out.stopped_how) == (ErrorClass.CANCELLED, StopMode.COOPERATIVE)
    assert len(names(ws)) == 3


# -- the workspace boundary ------------------------------------------------------------


def test_database_outside_the_workspace_is_refused(ws: Path, tmp_path: Path) -> None:
    sql(tmp_path / "outside.db", "CREATE TABLE secret (x)")
    for path in ["../outside.db", str(tmp_path / "outside.db")]:
        err = fails(ws, {"database": path, "query": "SELECT * FROM secret"})
        assert (err.status, err.error_class) == (Status.REJECTED, ErrorClass.PERMISSION_DENIED)


def test_symlink_escape_is_refused(ws: Path, tmp_path: Path) -> None:
    sql(tmp_path / "outside.db", "CREATE TABLE secret (x)")
    os.symlink(tmp_path / "outside.db", ws / "link.db")
    os.symlink(tmp_path, ws / "dirlink")
    for path in ["link.db", "dirlink/outside.db"]:
        err = fails(ws, {"database": path, "query": "DROP TABLE secret"})
        assert (err.status, err.error_class) == (Status.REJECTED, ErrorClass.PERMISSION_DENIED)
    assert sql(tmp_path / "outside.db", "SELECT count(*) FROM sqlite_master") == [(1,)]


def test_directory_swapped_for_a_symlink_after_analysis(ws: Path, tmp_path: Path) -> None:
    (ws / "sub").mkdir()
    sql(ws / "sub" / "x.db", "CREATE TABLE secret (x)")
    args = {"database": "sub/x.db", "query": "DROP TABLE secret"}
    effects = Sql().effects(args, Workspace(ws))
    (tmp_path / "out").mkdir()
    sql(tmp_path / "out" / "x.db", "CREATE TABLE secret (x)")
    (ws / "sub").rename(ws / "sub-old")
    os.symlink(tmp_path / "out", ws / "sub")
    with pytest.raises(ToolError) as info:
        asyncio.run(Sql().run(args, ctx_for(ws), effects=effects))
    assert info.value.error_class is ErrorClass.PERMISSION_DENIED
    assert sql(tmp_path / "out" / "x.db", "SELECT count(*) FROM sqlite_master") == [(1,)]


def test_missing_database(ws: Path) -> None:
    err = fails(ws, {"database": "new.db", "query": "CREATE TABLE x (y)"})
    assert (err.error_class, err.field) == (ErrorClass.NOT_FOUND, "arguments.database")
    assert not (ws / "new.db").exists()
    run(ws, {"database": "new.db", "query": "CREATE TABLE x (y)", "create": True})
    assert sql(ws / "new.db", "SELECT name FROM sqlite_master") == [("x",)]


def test_create_needs_the_directory(ws: Path) -> None:
    err = fails(ws, {"database": "no/such/dir/x.db", "query": "SELECT 1", "create": True})
    assert err.error_class is ErrorClass.NOT_FOUND
    assert not (ws / "no").exists()


def test_not_a_database(ws: Path) -> None:
    (ws / "notes.txt").write_text("hello, this is not SQLite\n" * 100)
    err = fails(ws, {"database": "notes.txt", "query": "SELECT 1"})
    assert (err.error_class, err.field) == (ErrorClass.INVALID_ARGUMENT, "arguments.database")
    err = fails(ws, {"database": ".", "query": "SELECT 1"})
    assert err.error_class is ErrorClass.INVALID_ARGUMENT


# -- effects, before scheduling --------------------------------------------------------


def test_effects(ws: Path) -> None:
    sql(ws / "app.db", "CREATE VIEW named AS SELECT name FROM t;")
    tool, workspace = Sql(), Workspace(ws)

    def effects(query: str) -> SqlCallEffects:
        return tool.effects({"database": "./app.db", "query": query}, workspace)

    e = effects("SELECT * FROM t JOIN u ON u.t_id = t.id")
    assert (e.database, e.relative) == (ws / "app.db", "app.db")
    assert (e.sql.reads, e.sql.writes, e.sql.whole_db, e.read_only) == (
        {"t", "u"},
        set(),
        None,
        True,
    )
    e = effects("INSERT INTO u (t_id) SELECT id FROM t")
    assert (e.sql.reads, e.sql.writes, e.read_only) == ({"t"}, {"u"}, False)
    e = effects("SELECT * FROM named")
    assert (e.sql.whole_db, e.read_only) == (Mode.READ, True)
    assert effects("PRAGMA integrity_check").sql.whole_db is Mode.WRITE
    with pytest.raises(ToolError) as info:
        effects("  -- nothing\n")
    assert (info.value.status, info.value.field) == (Status.REJECTED, "arguments.query")


def test_effects_of_an_unreadable_database_are_the_whole_database(ws: Path) -> None:
    (ws / "junk.db").write_bytes(b"\x00junk" * 1000)
    e = Sql().effects({"database": "junk.db", "query": "SELECT 1"}, Workspace(ws))
    assert e.sql.whole_db is Mode.WRITE


def test_registered_with_a_database_resource() -> None:
    tool = builtin_tools()["sql"]
    assert isinstance(tool, Sql)
    assert tool.spec.may_write
    assert tool.spec.destructive
    [template] = tool.spec.resources
    assert (template.kind, template.argument, template.mode) == (
        ResourceKind.FILE,
        "database",
        Mode.WRITE,
    )


# -- COMMIT ----------------------------------------------------------------------------


class _FailingCommit:
    """A connection whose COMMIT fails with `code`."""

    def __init__(self, code: int, still_open: bool) -> None:
        self.code = code
        self.in_transaction = still_open
        self.sent: list[str] = []

    def set_progress_handler(self, *_: Any) -> None:
        pass

    def execute(self, text: str) -> None:
        self.sent.append(text)
        if text == "COMMIT":
            exc = sqlite3.OperationalError("commit failed")
            exc.sqlite_errorcode = self.code  # type: ignore[attr-defined]
            raise exc
        self.in_transaction = False


def test_commit_failure_is_uncertain() -> None:
    conn = _FailingCommit(sqlite3.SQLITE_IOERR, still_open=False)
    with pytest.raises(sqlexec.CommitUncertain):
        sqlexec._commit(conn)  # type: ignore[arg-type]


def test_commit_busy_with_the_transaction_open_is_a_known_failure() -> None:
    conn = _FailingCommit(sqlite3.SQLITE_BUSY, still_open=True)
    with pytest.raises(ToolError) as info:
        sqlexec._commit(conn)  # type: ignore[arg-type]
    assert info.value.error_class is ErrorClass.IO_ERROR
    assert conn.sent == ["COMMIT", "ROLLBACK"]
