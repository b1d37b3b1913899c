"""The `sql` tool's SQLite authorizer: the engine refuses what the call was not cleared for.

SQLite asks the authorizer about every table access, pragma, ATTACH and
transaction statement while it compiles a statement, naming the real tables --
also those reached through views and triggers. That makes the analysis made
before scheduling binding: a table it did not find (a trigger created since, a
parser disagreement) is refused, and the call fails with nothing committed,
instead of touching a table nobody locked.
"""

from __future__ import annotations

import sqlite3

from execgate.executor.locks import Mode

from . import sqlanalysis  # a module import: see tools/sql.py

# Pure introspection: any argument (a table or index name, a row limit).
QUERY_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
        "foreign_key_check",
        "integrity_check",
        "quick_check",
        "database_list",
        "collation_list",
        "function_list",
        "module_list",
        "pragma_list",
        "compile_options",
    }
)
# Values in the database header, set inside the transaction like any write.
HEADER_PRAGMAS = frozenset({"user_version", "application_id"})
# Settings that may be read but not changed.
READABLE_PRAGMAS = frozenset(
    {
        "schema_version",
        "data_version",
        "page_size",
        "page_count",
        "freelist_count",
        "encoding",
        "journal_mode",
        "foreign_keys",
        "auto_vacuum",
    }
)
DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer"})

# Action -> (which argument names the table, 1 or 2; the access it is). REINDEX is
# not here: it names an index, and CREATE INDEX asks for it too.
_TABLE_ACTIONS: dict[int, tuple[int, Mode]] = {
    sqlite3.SQLITE_READ: (1, Mode.READ),
    sqlite3.SQLITE_INSERT: (1, Mode.WRITE),
    sqlite3.SQLITE_UPDATE: (1, Mode.WRITE),
    sqlite3.SQLITE_DELETE: (1, Mode.WRITE),
    sqlite3.SQLITE_CREATE_TABLE: (1, Mode.WRITE),
    sqlite3.SQLITE_DROP_TABLE: (1, Mode.WRITE),
    sqlite3.SQLITE_CREATE_VIEW: (1, Mode.WRITE),
    sqlite3.SQLITE_DROP_VIEW: (1, Mode.WRITE),
    sqlite3.SQLITE_CREATE_VTABLE: (1, Mode.WRITE),
    sqlite3.SQLITE_DROP_VTABLE: (1, Mode.WRITE),
    sqlite3.SQLITE_ANALYZE: (1, Mode.WRITE),
    sqlite3.SQLITE_CREATE_INDEX: (2, Mode.WRITE),
    sqlite3.SQLITE_DROP_INDEX: (2, Mode.WRITE),
    sqlite3.SQLITE_CREATE_TRIGGER: (2, Mode.WRITE),
    sqlite3.SQLITE_DROP_TRIGGER: (2, Mode.WRITE),
    sqlite3.SQLITE_ALTER_TABLE: (2, Mode.WRITE),  # argument 1 is the schema name
}


class Guard:
    """Authorizer callback for one call's connection.

    Invariant: while `armed` is false everything is allowed (the tool's own BEGIN,
    PRAGMAs, COMMIT, ROLLBACK); `denial` holds the first refusal's reason.
    """

    def __init__(self, effects: sqlanalysis.SqlEffects) -> None:
        self.effects = effects
        # Folded names of the database's tables and views, read inside the
        # transaction before the guard is armed (see `check`).
        self.tables: frozenset[str] = frozenset()
        self.armed = False
        self.denial = ""

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, via: str | None
    ) -> int:
        if not self.armed:
            return sqlite3.SQLITE_OK
        reason = self.check(action, arg1, arg2, db, via)
        if reason is None:
            return sqlite3.SQLITE_OK
        self.denial = self.denial or reason
        return sqlite3.SQLITE_DENY

    def check(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, via: str | None
    ) -> str | None:
        """None when allowed, else why not."""
        if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
            return (
                "BEGIN, COMMIT, ROLLBACK, SAVEPOINT and RELEASE are not allowed: "
                "the tool runs the whole query as one transaction"
            )
        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            return "ATTACH, DETACH and VACUUM INTO are not allowed (files outside the workspace)"
        if action == sqlite3.SQLITE_PRAGMA:
            return _pragma(sqlanalysis.fold(arg1 or ""), arg2)
        if action == sqlite3.SQLITE_FUNCTION and sqlanalysis.fold(arg2 or "") in DENIED_FUNCTIONS:
            return f"the function {arg2} is not allowed"
        if db not in ("main", None):
            return None  # temp objects belong to this call's connection alone
        spec = _TABLE_ACTIONS.get(action)
        if spec is None:
            return None
        table = sqlanalysis.fold((arg1 if spec[0] == 1 else arg2) or "")
        if db is None and action == sqlite3.SQLITE_READ and table not in self.tables:
            # `count(*)` reports its FROM item without a schema, and that item may
            # be a CTE, which is no table of the database.
            return None
        return self._table(table, spec[1], via)

    def _table(self, table: str, mode: Mode, via: str | None) -> str | None:
        if table.startswith("sqlite_") or table in sqlanalysis.HARMLESS_FUNCTIONS:
            return None  # the schema's own bookkeeping; table-valued functions
        eff = self.effects
        if mode is Mode.READ:
            ok = eff.whole_db is not None or table in eff.reads or table in eff.writes
        else:
            ok = eff.whole_db is Mode.WRITE or table in eff.writes
        if ok:
            return None
        verb = "reads" if mode is Mode.READ else "writes"
        through = f" through {via!r}" if via else ""
        return (
            f"the query {verb} table {table!r}{through}, which the analysis made before "
            "it was scheduled did not find (was the schema changed?); nothing was committed"
        )


def _pragma(name: str, value: str | None) -> str | None:
    if name in QUERY_PRAGMAS or name in HEADER_PRAGMAS:
        return None
    if name in READABLE_PRAGMAS and value is None:
        return None
    return f"PRAGMA {name} is not allowed by the sql tool (only introspection pragmas are)"
