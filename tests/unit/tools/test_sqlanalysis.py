"""sqlanalysis: the tables an SQL text reads and writes, from the parser."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from execgate.executor.tools.base import Mode
from execgate.executor.tools.sqlanalysis import (
    NoStatements,
    SchemaInfo,
    SqlEffects,
    analyze,
    schema_of,
    split_statements,
)

R, W = Mode.READ, Mode.WRITE

# (sql, reads, writes, whole_db) -- analysed without a schema.
CASES: list[tuple[str, set[str], set[str], Mode | None]] = [
    # Queries.
    ("SELECT * FROM a JOIN b ON a.x = b.y", {"a", "b"}, set(), None),
    ("SELECT * FROM a, b NATURAL JOIN c", {"a", "b", "c"}, set(), None),
    ("SELECT * FROM (SELECT * FROM a) AS s", {"a"}, set(), None),
    ("SELECT * FROM a WHERE x IN (SELECT y FROM b)", {"a", "b"}, set(), None),
    ("SELECT * FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.x = a.x)", {"a", "b"}, set(), None),
    ("SELECT (SELECT max(y) FROM b WHERE b.k = a.k) FROM a", {"a", "b"}, set(), None),
    ("SELECT x FROM a UNION SELECT y FROM b", {"a", "b"}, set(), None),
    (
        "SELECT x FROM a EXCEPT SELECT x FROM b INTERSECT SELECT x FROM c",
        {"a", "b", "c"},
        set(),
        None,
    ),
    ("VALUES (1), (2)", set(), set(), None),
    ("SELECT * FROM a WHERE x IN b", {"a", "b"}, set(), None),
    ("SELECT * FROM a INDEXED BY a_idx", {"a"}, set(), None),
    ("SELECT value FROM json_each('[1, 2]')", set(), set(), None),
    ("SELECT * FROM 'a'", {"a"}, set(), None),
    # CTEs: their names are not tables, their bodies are read, scoping is SQLite's.
    ("WITH c AS (SELECT * FROM a) SELECT * FROM c", {"a"}, set(), None),
    ("WITH b1 AS (SELECT * FROM c1), c1 AS (SELECT * FROM a) SELECT * FROM b1", {"a"}, set(), None),
    (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM n WHERE x < 9) SELECT x FROM n",
        set(),
        set(),
        None,
    ),
    ("WITH a AS (SELECT 1) SELECT * FROM a UNION SELECT * FROM a", set(), set(), None),
    ("SELECT * FROM a WHERE x IN (WITH a AS (SELECT 1 AS x) SELECT x FROM a)", {"a"}, set(), None),
    ("SELECT * FROM (WITH t AS (SELECT 1) SELECT * FROM t) AS s, t", {"t"}, set(), None),
    ("WITH t AS (SELECT 1) SELECT * FROM main.t JOIN t", {"t"}, set(), None),
    ("WITH t AS (SELECT 1) SELECT * FROM a WHERE x IN main.t", {"a", "t"}, set(), None),
    ("WITH c AS (SELECT * FROM a) INSERT INTO t SELECT * FROM c", {"a"}, {"t"}, None),
    ("INSERT INTO t WITH c AS (SELECT * FROM a) SELECT * FROM c", {"a"}, {"t"}, None),
    ("WITH x AS (SELECT 1) DELETE FROM t WHERE id IN x", set(), {"t"}, None),
    # Names: case-folded (quoted too), `main.` dropped, literals and comments ignored.
    ('SELECT * FROM "My Table" JOIN [b] JOIN `C`', {"my table", "b", "c"}, set(), None),
    ("SELECT * FROM Foo JOIN FOO ON 1 JOIN main.foo", {"foo"}, set(), None),
    ("SELECT * FROM temp.t", {"temp.t"}, set(), None),
    ("SELECT 'FROM x JOIN y' AS s FROM a WHERE b = 'DELETE FROM t'", {"a"}, set(), None),
    ('SELECT "x" FROM a', {"a"}, set(), None),
    ("/* DROP TABLE x; */ SELECT * FROM a -- JOIN b; DELETE FROM c\n", {"a"}, set(), None),
    ("EXPLAIN QUERY PLAN SELECT * FROM a JOIN b", {"a", "b"}, set(), None),
    # Writes.
    ("INSERT INTO t (x, y) VALUES (1, 2)", set(), {"t"}, None),
    ("INSERT INTO t DEFAULT VALUES", set(), {"t"}, None),
    ("INSERT INTO c SELECT * FROM a JOIN b USING (id)", {"a", "b"}, {"c"}, None),
    ("INSERT INTO t VALUES ((SELECT max(x) FROM a))", {"a"}, {"t"}, None),
    (
        "INSERT INTO t (k, v) VALUES (1, 2) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
        set(),
        {"t"},
        None,
    ),
    ("INSERT OR REPLACE INTO t VALUES (1)", set(), {"t"}, None),
    ("REPLACE INTO t SELECT * FROM a", {"a"}, {"t"}, None),
    ("INSERT INTO t VALUES (1) RETURNING *", set(), {"t"}, None),
    (
        "UPDATE t SET x = (SELECT y FROM u WHERE u.id = t.id) WHERE z IN (SELECT z FROM w)",
        {"u", "w"},
        {"t"},
        None,
    ),
    ("UPDATE t SET x = u.y FROM u WHERE u.id = t.id", {"u"}, {"t"}, None),
    ("UPDATE t SET x = 1 RETURNING (SELECT count(*) FROM u)", {"u"}, {"t"}, None),
    ("DELETE FROM t WHERE id IN (SELECT id FROM u)", {"u"}, {"t"}, None),
    ("DELETE FROM T", set(), {"t"}, None),
    # DDL writes the table it names.
    ("CREATE TABLE t (x INTEGER PRIMARY KEY, y TEXT REFERENCES p(id))", set(), {"t"}, None),
    ("CREATE TABLE IF NOT EXISTS t AS SELECT * FROM a", {"a"}, {"t"}, None),
    ("DROP TABLE IF EXISTS main.T", set(), {"t"}, None),
    ("ALTER TABLE t ADD COLUMN z INTEGER", set(), {"t"}, None),
    ("ALTER TABLE t RENAME TO u", set(), {"t", "u"}, None),
    ("ALTER TABLE t RENAME COLUMN a TO b", set(), {"t"}, None),
    ("CREATE UNIQUE INDEX IF NOT EXISTS i ON t (x)", set(), {"t"}, None),
    ("CREATE VIEW v AS SELECT * FROM a JOIN b", {"a", "b"}, {"v"}, None),
    ("DROP VIEW IF EXISTS v", set(), {"v"}, None),
    # Several statements: the union.
    ("INSERT INTO t VALUES (1); SELECT * FROM a; DELETE FROM u;", {"a"}, {"t", "u"}, None),
    ("SELECT ';' FROM a; SELECT * FROM b", {"a", "b"}, set(), None),
    # The schema itself and table-valued pragmas: may read anything.
    ("SELECT name FROM sqlite_master", set(), set(), R),
    ("SELECT * FROM pragma_table_info('t')", set(), set(), R),
    ("SELECT * FROM a; SELECT * FROM sqlite_schema", {"a"}, set(), R),
    # Not understood, or outside what the tool may do: the whole database, written.
    ("PRAGMA journal_mode", set(), set(), W),
    ("PRAGMA table_info(t)", set(), set(), W),
    ("ATTACH DATABASE 'other.db' AS o", set(), set(), W),
    ("DETACH o", set(), set(), W),
    ("VACUUM", set(), set(), W),
    ("REINDEX", set(), set(), W),
    ("ANALYZE", set(), set(), W),
    ("CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM u; END", set(), set(), W),
    ("DROP TRIGGER tr", set(), set(), W),
    ("DROP INDEX i", set(), set(), W),
    ("CREATE VIRTUAL TABLE f USING fts5(body)", set(), set(), W),
    ("BEGIN", set(), set(), W),
    ("BEGIN IMMEDIATE", set(), set(), W),
    ("COMMIT", set(), set(), W),
    ("END", set(), set(), W),
    ("ROLLBACK", set(), set(), W),
    ("SAVEPOINT sp", set(), set(), W),
    ("RELEASE sp", set(), set(), W),
    ("SELEC * FROM a", set(), set(), W),
    ("SELECT * FROM", set(), set(), W),
    ("UPDATE OR IGNORE t SET x = 1", set(), set(), W),
    ("INSERT INTO sqlite_sequence VALUES ('t', 1)", set(), set(), W),
    ("SELECT * FROM a; PRAGMA writable_schema = 1", {"a"}, set(), W),
]


@pytest.mark.parametrize(("sql", "reads", "writes", "whole"), CASES, ids=[c[0] for c in CASES])
def test_analyze(sql: str, reads: set[str], writes: set[str], whole: Mode | None) -> None:
    found = analyze(sql)
    assert (set(found.reads), set(found.writes), found.whole_db) == (reads, writes, whole)


SCHEMA = SchemaInfo(
    views=frozenset({"v"}),
    tables_with_triggers=frozenset({"audited"}),
    virtual_tables=frozenset({"docs"}),
    indexes={"t_x": "t"},
)

# (sql, reads, writes, whole_db) -- analysed with SCHEMA.
SCHEMA_CASES: list[tuple[str, set[str], set[str], Mode | None]] = [
    ("SELECT * FROM v JOIN a", {"a"}, set(), R),
    ("SELECT * FROM V", set(), set(), R),
    ("INSERT INTO c SELECT * FROM v", set(), {"c"}, R),
    ("WITH v AS (SELECT 1) SELECT * FROM v", set(), set(), None),
    ("INSERT INTO audited VALUES (1)", set(), set(), W),
    ("UPDATE Audited SET x = 1", set(), set(), W),
    ("DELETE FROM audited", set(), set(), W),
    ("REPLACE INTO audited VALUES (1)", set(), set(), W),
    ("INSERT INTO v VALUES (1)", set(), set(), W),
    ("INSERT INTO plain SELECT * FROM audited", {"audited"}, {"plain"}, None),
    ("DROP TABLE audited", set(), {"audited"}, None),
    ("DROP VIEW v", set(), {"v"}, None),
    ("DROP INDEX t_x", set(), {"t"}, None),
    ("DROP INDEX unknown_idx", set(), set(), W),
    ("SELECT * FROM docs WHERE docs MATCH 'x'", set(), set(), R),
    ("INSERT INTO docs VALUES ('x')", set(), set(), W),
    ("DROP TABLE docs", set(), set(), W),
]


@pytest.mark.parametrize(
    ("sql", "reads", "writes", "whole"), SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES]
)
def test_analyze_with_schema(
    sql: str, reads: set[str], writes: set[str], whole: Mode | None
) -> None:
    found = analyze(sql, SCHEMA)
    assert (set(found.reads), set(found.writes), found.whole_db) == (reads, writes, whole)


@pytest.mark.parametrize("sql", ["", "   \n", "-- only a comment", ";;", "/* c */ ;", "\t;\n;"])
def test_no_statement_is_invalid(sql: str) -> None:
    with pytest.raises(NoStatements):
        analyze(sql)


@pytest.mark.parametrize(
    ("sql", "count"),
    [
        ("SELECT 1", 1),
        ("SELECT 1;", 1),
        ("SELECT 1;; SELECT 2 ; ", 2),
        ("SELECT 'a;b'; SELECT \"c;d\" FROM t; -- e;f\n", 2),
        ("CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM u; SELECT 1; END; SELECT 2", 2),
    ],
)
def test_statement_count(sql: str, count: int) -> None:
    assert analyze(sql).statements == count
    assert len(split_statements(sql)) == count


def test_split_keeps_trigger_bodies_whole() -> None:
    sql = "CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM u; END; SELECT 1 -- done"
    first, second = split_statements(sql)
    assert first.endswith("END;")
    assert sqlite3.complete_statement(first)
    assert second.strip() == "SELECT 1 -- done"


def test_read_only() -> None:
    assert analyze("SELECT * FROM a").read_only
    assert analyze("SELECT * FROM sqlite_master").read_only  # whole_db READ still reads
    assert not analyze("INSERT INTO t VALUES (1)").read_only
    assert not analyze("SELECT * FROM a; CREATE TABLE b (x)").read_only
    assert not analyze("PRAGMA user_version").read_only
    assert not SqlEffects(frozenset(), frozenset(), Mode.WRITE, 1).read_only


def test_schema_of_reads_views_triggers_indexes(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.executescript(
            """
            CREATE TABLE "Orders" (id INTEGER PRIMARY KEY, total REAL);
            CREATE TABLE log (msg TEXT);
            CREATE INDEX orders_total ON Orders (total);
            CREATE VIEW Big AS SELECT * FROM Orders WHERE total > 100;
            CREATE TRIGGER t_log AFTER INSERT ON Orders BEGIN INSERT INTO log VALUES ('x'); END;
            CREATE TRIGGER v_ins INSTEAD OF INSERT ON big BEGIN SELECT 1; END;
            """
        )
    info = schema_of(db)
    assert info.views == {"big"}
    assert info.tables_with_triggers == {"orders", "big"}
    assert dict(info.indexes) == {"orders_total": "orders"}
    assert info.virtual_tables == frozenset()
    assert analyze("INSERT INTO orders VALUES (1, 2)", info).whole_db is Mode.WRITE
    assert analyze("INSERT INTO log VALUES ('y')", info).writes == {"log"}
    assert analyze("DROP INDEX orders_total", info).writes == {"orders"}


def test_schema_of_virtual_tables(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            conn.execute("CREATE VIRTUAL TABLE docs USING fts5(body)")
        except sqlite3.OperationalError:
            pytest.skip("this SQLite has no fts5")
    assert "docs" in schema_of(db).virtual_tables


def test_schema_of_missing_file_is_empty(tmp_path: Path) -> None:
    assert schema_of(tmp_path / "new.db") == SchemaInfo()


def test_schema_names_are_folded() -> None:
    info = SchemaInfo(views=frozenset({"MyView"}), indexes={"IDX": "T"})
    assert info.views == {"myview"}
    assert dict(info.indexes) == {"idx": "t"}
    assert analyze("SELECT * FROM myview", info).whole_db is Mode.READ
