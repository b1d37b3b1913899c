"""What an SQL text reads and writes, from a real parser (sqlglot), before it runs.

The scheduler locks `table:<db>/<t>` keys from this, and the `sql` tool decides
from it whether a call may write. Every rule errs the same way: when in doubt the
effect grows (a table becomes the whole database, a read becomes a write), never
shrinks. Anything not understood -- a statement that does not parse, PRAGMA,
ATTACH, VACUUM, triggers, transaction control, any statement kind not handled
below -- is `whole_db=WRITE`.

Names are folded to ASCII lower case whether quoted or not: SQLite matches table
names case-insensitively for ASCII letters even inside quotes (`"T"` is `t`), and
only for ASCII (`Ä` is not `ä`). A `main.` qualifier is dropped; any other
qualifier is kept (`temp.t`).

Statement boundaries come from SQLite itself (`sqlite3.complete_statement`), with
sqlglot's tokenizer proposing the candidate `;`s, so the analysis and the tool
split a text into exactly the same statements.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType  # type: ignore[attr-defined]

from execgate.executor.core.errors import ExecgateError
from execgate.executor.locks import Mode

# sqlglot logs the text of statements it cannot fully parse; tool arguments are
# never logged.
logging.getLogger("sqlglot").setLevel(logging.CRITICAL)

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# Table-valued functions that read nothing of the database.
HARMLESS_FUNCTIONS = frozenset({"json_each", "json_tree", "generate_series"})
_STATEMENTS = (exp.Insert, exp.Update, exp.Delete, exp.Create, exp.Drop, exp.Alter, exp.Command)


class NoStatements(ExecgateError, ValueError):
    """The text holds no SQL statement (empty, blanks, comments or bare `;`)."""


def fold(name: str) -> str:
    """SQLite's identifier comparison: ASCII letters only, quoted or not."""
    return name.translate(_ASCII_LOWER)


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """What the analysis must know of a database's schema. Names are folded."""

    # Reading a view reads tables the text does not name.
    views: frozenset[str] = frozenset()
    # Writing such a table runs trigger programs that may touch anything.
    tables_with_triggers: frozenset[str] = frozenset()
    # Virtual tables keep their data in shadow tables of other names.
    virtual_tables: frozenset[str] = frozenset()
    # Index name -> the table it indexes (lets DROP INDEX name a table).
    indexes: Mapping[str, str] = field(default_factory=dict, hash=False)
    # The database is in WAL mode: readers do not block a writer's COMMIT, so a
    # reader of one table and a writer of another can really run together.
    wal: bool = False

    def __post_init__(self) -> None:
        for name in ("views", "tables_with_triggers", "virtual_tables"):
            object.__setattr__(self, name, frozenset(fold(n) for n in getattr(self, name)))
        object.__setattr__(self, "indexes", {fold(k): fold(v) for k, v in self.indexes.items()})


@dataclass(frozen=True, slots=True)
class SqlEffects:
    """The tables a text reads and writes.

    `whole_db` is None when the table sets are the whole story; READ means "may
    read any table" (a view, the schema), WRITE "may write anything".
    """

    reads: frozenset[str]
    writes: frozenset[str]
    whole_db: Mode | None
    statements: int

    @property
    def read_only(self) -> bool:
        return not self.writes and self.whole_db is not Mode.WRITE


def schema_of(db_path: str | Path) -> SchemaInfo:
    """Read a database's views, triggers, virtual tables and indexes (read-only).

    A missing file is an empty schema (a database the call will create). Raises
    `sqlite3.Error` when the file cannot be read as a database.
    """
    if not Path(db_path).exists():
        return SchemaInfo()
    uri = f"file:{quote(str(db_path), safe='/')}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=1.0)
    try:
        rows = conn.execute("SELECT type, name, tbl_name, rootpage FROM sqlite_master").fetchall()
        (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
    finally:
        conn.close()
    return SchemaInfo(
        wal=str(mode).lower() == "wal",
        views=frozenset(name for kind, name, _, _ in rows if kind == "view"),
        tables_with_triggers=frozenset(table for kind, _, table, _ in rows if kind == "trigger"),
        # A table without pages of its own is virtual.
        virtual_tables=frozenset(n for kind, n, _, root in rows if kind == "table" and not root),
        indexes={name: table for kind, name, table, _ in rows if kind == "index"},
    )


def split_statements(sql: str) -> list[str]:
    """The statements of `sql` as SQLite will see them, blank ones dropped.

    When the tokenizer fails the whole text is one statement: the analysis then
    fails to parse it (whole_db=WRITE), and if SQLite finds several statements in
    it, executing it is an error rather than a partial run.
    """
    try:
        tokens = sqlglot.tokenize(sql, read="sqlite")
    except Exception:
        return [sql] if sql.strip() else []
    chunks: list[str] = []
    start, content = 0, False
    for token in tokens:
        if token.token_type is not TokenType.SEMICOLON:
            content = True
            continue
        end = token.end + 1
        # A `;` inside a trigger body ends nothing; SQLite has the last word.
        if sqlite3.complete_statement(sql[start:end]):
            if content:
                chunks.append(sql[start:end])
            start, content = end, False
    if content:
        chunks.append(sql[start:])
    return chunks


def analyze(sql: str, schema: SchemaInfo | None = None) -> SqlEffects:
    """Tables read and written by every statement of `sql`, unioned.

    Without `schema`, views are taken for tables and triggers are not seen: pass
    `schema_of(db)` whenever the database exists. Raises `NoStatements` for a
    text without any statement.
    """
    chunks = split_statements(sql)
    if not chunks:
        raise NoStatements("the query contains no SQL statement")
    acc = _Acc(schema or SchemaInfo())
    for chunk in chunks:
        _chunk(chunk, acc)
    return SqlEffects(frozenset(acc.reads), frozenset(acc.writes), acc.whole, len(chunks))


@dataclass(slots=True)
class _Acc:
    """The effects found so far; they only ever grow."""

    schema: SchemaInfo
    reads: set[str] = dataclasses.field(default_factory=set)
    writes: set[str] = dataclasses.field(default_factory=set)
    whole: Mode | None = None

    def whole_db(self, mode: Mode) -> None:
        if mode is Mode.WRITE or self.whole is None:
            self.whole = mode

    def read(self, name: str | None) -> None:
        s = self.schema
        if name is None or name.startswith("sqlite_") or name in s.views:
            # The schema, a view: they read tables the text does not name.
            self.whole_db(Mode.READ)
        elif name in s.virtual_tables:  # its data lives in shadow tables
            self.whole_db(Mode.READ)
        else:
            self.reads.add(name)

    def write(self, name: str | None, *, dml: bool) -> None:
        s = self.schema
        if name is None or name.startswith("sqlite_") or name in s.virtual_tables:
            self.whole_db(Mode.WRITE)
            return
        # A DML write to a view or to a table with triggers runs trigger programs.
        if dml and (name in s.tables_with_triggers or name in s.views):
            self.whole_db(Mode.WRITE)
            return
        self.writes.add(name)


def _chunk(chunk: str, acc: _Acc) -> None:
    node = _parse_one(chunk)
    if node is None:
        acc.whole_db(Mode.WRITE)
    else:
        _statement(node, acc)


def _parse_one(text: str) -> exp.Expression | None:
    """The one statement in `text`, or None when it does not parse as exactly one."""
    try:
        parsed = [s for s in sqlglot.parse(text, read="sqlite") if s is not None]
    except Exception:  # ParseError, TokenError, RecursionError on deep nesting
        return None
    if len(parsed) != 1 or not isinstance(parsed[0], exp.Expression):
        return None
    return parsed[0]


def _statement(node: exp.Expression, acc: _Acc) -> None:
    match node:
        case exp.Query() | exp.Values():
            _reads_in(node, acc)
        case exp.Insert() | exp.Update() | exp.Delete():
            target = node.this.this if isinstance(node.this, exp.Schema) else node.this
            if not isinstance(target, exp.Table):
                acc.whole_db(Mode.WRITE)
                return
            acc.write(_table_name(target), dml=True)
            _reads_in(node, acc, skip=target)
        case exp.Create():
            _create(node, acc)
        case exp.Drop():
            _drop(node, acc)
        case exp.Alter() if str(node.args.get("kind", "")).upper() == "TABLE":
            acc.write(_table_name(node.this), dml=False)
            for action in node.args.get("actions") or []:
                if isinstance(action, exp.AlterRename):
                    acc.write(_table_name(action.this), dml=False)
        case exp.Command():
            _command(node, acc)
        case _:
            acc.whole_db(Mode.WRITE)


def _create(node: exp.Create, acc: _Acc) -> None:
    kind = str(node.args.get("kind", "")).upper()
    target = node.this.this if isinstance(node.this, exp.Schema) else node.this
    if kind == "INDEX" and isinstance(target, exp.Index):
        acc.write(_table_name(target.args.get("table")), dml=False)
    elif kind in ("TABLE", "VIEW") and not node.find(exp.VirtualProperty):
        acc.write(_table_name(target), dml=False)
        if node.expression is not None:  # AS SELECT ...
            _reads_in(node.expression, acc)
    else:  # CREATE VIRTUAL TABLE makes shadow tables; anything else is not understood
        acc.whole_db(Mode.WRITE)


def _drop(node: exp.Drop, acc: _Acc) -> None:
    kind = str(node.args.get("kind", "")).upper()
    for table in node.args.get("tables") or []:
        name = _table_name(table)
        if kind in ("TABLE", "VIEW"):
            acc.write(name, dml=False)
        elif kind == "INDEX" and name is not None and name in acc.schema.indexes:
            acc.write(acc.schema.indexes[name], dml=False)
        else:
            acc.whole_db(Mode.WRITE)


def _command(node: exp.Command, acc: _Acc) -> None:
    """Statements sqlglot keeps as raw text: REPLACE and EXPLAIN are re-parsed."""
    verb = str(node.this).upper()
    rest = node.expression.name if isinstance(node.expression, exp.Literal) else ""
    inner: exp.Expression | None = None
    if verb == "REPLACE":
        inner = _parse_one("INSERT OR REPLACE " + rest)
        inner = inner if isinstance(inner, exp.Insert) else None
    elif verb == "EXPLAIN":
        # EXPLAIN runs nothing; what the explained statement would touch is a bound.
        inner = _parse_one(_after_query_plan(rest))
    if inner is None:
        acc.whole_db(Mode.WRITE)
    else:
        _statement(inner, acc)


def _after_query_plan(text: str) -> str:
    try:
        tokens = sqlglot.tokenize(text, read="sqlite")
    except Exception:
        return text
    words = [t.text.upper() for t in tokens[:2]]
    if words == ["QUERY", "PLAN"] and len(tokens) > 2:
        return text[tokens[2].start :]
    return text


def _reads_in(root: exp.Expression, acc: _Acc, skip: exp.Expression | None = None) -> None:
    """Every table `root` reads: FROM, joins, subqueries, CTE bodies, `x IN t`."""
    if any(n is not root for n in root.find_all(*_STATEMENTS)):
        acc.whole_db(Mode.WRITE)  # a statement nested where SQLite allows none
    for node, name in _references(root):
        if node is skip or _is_cte(node, name):
            continue
        if isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier):
            _table_function(node.this, acc)
        else:
            acc.read(name)


def _references(root: exp.Expression) -> Iterator[tuple[exp.Expression, str | None]]:
    for node in root.find_all(exp.Table, exp.In):
        if isinstance(node, exp.In):
            # `x IN t` (no parentheses) names a table, which sqlglot parses as a column.
            target = node.args.get("field")
            if isinstance(target, exp.Column) and isinstance(target.this, exp.Identifier):
                yield target, _qualified(target.name, target.table, "")
        elif node.arg_key != "indexed":  # INDEXED BY names an index, not a table
            yield node, _table_name(node)


def _table_function(func: exp.Expression, acc: _Acc) -> None:
    name = func.name if isinstance(func, exp.Anonymous) else ""
    if fold(name) not in HARMLESS_FUNCTIONS and not isinstance(func, exp.GenerateSeries):
        acc.whole_db(Mode.READ)  # pragma_* and unknown table-valued functions


def _is_cte(node: exp.Expression, name: str | None) -> bool:
    """Does `name` refer to a CTE of an enclosing WITH (SQLite's scoping)?"""
    schema = node.args.get("db") if isinstance(node, exp.Table) else node.args.get("table")
    if name is None or schema:  # `main.t` is a table even where a CTE `t` exists
        return False
    parent = node.parent
    while parent is not None:
        with_ = parent.args.get("with_") or parent.args.get("with")
        if isinstance(with_, exp.With) and any(
            fold(cte.alias_or_name) == name for cte in with_.expressions
        ):
            return True
        parent = parent.parent
    return False


def _table_name(node: exp.Expression | None) -> str | None:
    """Folded name of a table reference; None when it names no table we can key."""
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        return None
    return _qualified(node.name, node.db, node.catalog)


def _qualified(name: str, db: str, catalog: str) -> str | None:
    if name == "":
        return None
    parts = [fold(p) for p in (catalog, db) if p] + [fold(name)]
    if len(parts) == 2 and parts[0] == "main":
        parts = parts[1:]
    return ".".join(parts)
