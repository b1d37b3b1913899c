"""Built-in `sql`: statements on an SQLite database file inside the workspace.

What a query reads and writes comes from `sqlanalysis` (a real SQL parser), and
`Sql.effects` hands it to the scheduler *before* the call is scheduled, so calls
on different tables of one database can run side by side and a read-only query
is known to be one. The engine then holds the call to that analysis (see
`sqlexec` and `sqlguard`).

How a call ends:

- completed: SUCCESS, or PARTIAL when rows were left out (`max_rows`, output cap);
- an SQL or I/O error: everything is rolled back, `ToolError` -> FAILURE
  (invalid_argument with sqlite's message, io_error, not_found, permission_denied);
- cancelled or timed out: the progress handler aborts the statement and the
  transaction is rolled back. Nothing can have been committed -- COMMIT is only
  sent after the last statement, and transaction control inside the query is
  refused -- so even a writing call stopped this way is a known no-effect stop,
  reported as `stopped_how=COOPERATIVE` with `error_class` timeout/cancelled and
  `structured["committed"] = False` (`results` still records an interrupted call
  that may write as UNKNOWN_OUTCOME until it is taught to read that proof);
- COMMIT itself failed in a way that does not prove nothing was committed:
  `CommitUncertain` (a RuntimeError) escapes, which dispatch records as
  UNKNOWN_OUTCOME/internal for a tool that may write.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from execgate.executor.core import clock
from execgate.executor.core.errors import invalid
from execgate.executor.core.outcomes import ErrorClass, Evidence, Mark, Phase, StopMode, mark
from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Claim, Mode, path_key, table_key

from . import sqlanalysis, sqlconfine, sqlexec
from .base import ResourceKind, ResourceTemplate, ToolContext, ToolOutput, ToolSpec, schema
from .effects import CallEffects

MAX_QUERY_CHARS = 1024 * 1024
_HEX = {
    "type": "object",
    "properties": {"hex": {"type": "string", "pattern": "^([0-9a-fA-F]{2})*$"}},
    "required": ["hex"],
    "additionalProperties": False,
}
_PARAM = {"anyOf": [{"type": ["string", "number", "boolean", "null"]}, _HEX]}


@dataclass(frozen=True, slots=True)
class SqlCallEffects:
    """What one `sql` call will touch, known before it is scheduled.

    Lock `table:<database>/<t>` for each of `sql.reads` (shared) and `sql.writes`
    (exclusive); `sql.whole_db` READ/WRITE means the whole database file instead.
    """

    database: Path  # canonical absolute path, inside the workspace
    relative: str  # the same, relative to the workspace root (for lock keys)
    sql: sqlanalysis.SqlEffects
    # The database exists and is in WAL mode (see `call_effects`).
    wal: bool = False

    @property
    def read_only(self) -> bool:
        """True when the call cannot write: interrupted, it is FAILURE, not UNKNOWN."""
        return self.sql.read_only


class Sql:
    spec = ToolSpec(
        name="sql",
        description=(
            "Run SQL on an SQLite database file in the workspace. `query` may hold several "
            "statements separated by ';'; they run as one transaction (all or nothing), so "
            "BEGIN/COMMIT/SAVEPOINT, ATTACH and most PRAGMAs are refused. `params` binds "
            "'?' (array) or ':name' (object, names without ':') in a single statement; "
            'blobs are {"hex": "..."} both ways. Returns the last result set '
            "(tab-separated, at most `max_rows` rows) or the number of rows changed."
        ),
        input_schema=schema(
            {
                "database": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Path of the database file inside the workspace.",
                },
                "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS},
                "params": {
                    "type": ["array", "object"],
                    "items": _PARAM,
                    "additionalProperties": _PARAM,
                },
                "max_rows": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
                "create": {
                    "type": "boolean",
                    "default": False,
                    "description": "Create the database file if it does not exist.",
                },
            },
            ["database", "query"],
        ),
        read_only=False,
        destructive=True,
        # Listed so that validation resolves `database`: a path outside the workspace
        # is REJECTED before the call starts. The real locks come from `effects`.
        resources=(ResourceTemplate(ResourceKind.FILE, "database", Mode.WRITE),),
    )

    def effects(self, args: dict[str, Any], workspace: Workspace) -> SqlCallEffects:
        """The database and the tables this call reads and writes, before it runs.

        Blocking (reads the database's schema, parses the query): call it from a
        worker thread. Raises `ToolError` (REJECTED, invalid_argument or
        permission_denied) for a path outside the workspace, a query without
        statements or with a NUL, and `params` with several statements. When the
        schema cannot be read the result is `whole_db=WRITE`.
        """
        path = workspace.resolve(args["database"], "arguments.database")
        query = args["query"]
        if "\x00" in query:
            raise invalid("query contains a NUL character", "arguments.query")
        try:
            # Before the policy is asked: a hard-linked database is not even read here.
            with sqlconfine.confined(workspace.root, workspace.fd, lambda _rel: False):
                db_schema: sqlanalysis.SchemaInfo | None = sqlanalysis.schema_of(path)
        except (OSError, sqlite3.Error):
            db_schema = None  # the run will say what is wrong; until then assume the worst
        try:
            found = sqlanalysis.analyze(query, db_schema)
        except sqlanalysis.NoStatements as exc:
            raise invalid(str(exc), "arguments.query") from exc
        if db_schema is None:
            found = replace(found, whole_db=Mode.WRITE)
        if args.get("params") is not None and found.statements != 1:
            raise invalid(
                f"params can only be used with a single statement; the query has "
                f"{found.statements}",
                "arguments.params",
            )
        wal = db_schema is not None and db_schema.wal
        return SqlCallEffects(path, workspace.relative(path), found, wal)

    def call_effects(
        self, args: dict[str, Any], paths: Mapping[str, Path], workspace: Workspace
    ) -> CallEffects:
        """Lock claims from the parsed statement: tables, or the whole database file."""
        found = self.effects(args, workspace)
        db, sql = found.relative, found.sql
        root = workspace.lock_root
        claims: list[Claim] = []
        if sql.whole_db is not None:
            claims.append(Claim(path_key(root, db), sql.whole_db))
        elif not found.read_only and not found.wal:
            # Outside WAL mode SQLite cannot COMMIT while any other connection is
            # reading, whatever the table: a writer needs the whole file to itself,
            # or it would fail at COMMIT behind a reader the scheduler let in.
            claims.append(Claim(path_key(root, db), Mode.WRITE))
        else:
            claims += [Claim(table_key(root, db, t), Mode.WRITE) for t in sorted(sql.writes)]
            claims += [
                Claim(table_key(root, db, t), Mode.READ) for t in sorted(sql.reads - sql.writes)
            ]
        if args.get("create", False) and not found.database.exists():
            claims.append(Claim(path_key(root, db), Mode.WRITE))
        may_write = not found.read_only or any(c.mode is Mode.WRITE for c in claims)
        return CallEffects(tuple(claims), may_write, found)

    async def run(
        self, args: dict[str, Any], ctx: ToolContext, effects: SqlCallEffects | None = None
    ) -> ToolOutput:
        """Run the query in one transaction.

        Pass the `effects` the call was scheduled with: the engine then refuses any
        table access beyond them. Without, they are computed now.
        """
        if effects is None and isinstance(ctx.analysis, SqlCallEffects):
            effects = ctx.analysis
        if effects is None:
            effects = await asyncio.to_thread(self.effects, args, ctx.workspace)
        plan = sqlexec.Plan(
            path=effects.database,
            create=args.get("create", False),
            statements=tuple(sqlanalysis.split_statements(args["query"])),
            params=_params(args.get("params")),
            max_rows=args.get("max_rows", 1000),
            byte_cap=ctx.limits.output_cap_bytes,
            effects=effects.sql,
            hard_links_ok=ctx.hard_links,
        )
        stop = sqlexec.Stop(ctx.cancel, time.monotonic() + ctx.timeout)
        try:
            ran = await asyncio.to_thread(sqlexec.execute, plan, ctx.workspace, stop)
        except asyncio.CancelledError:
            stop.aborted.set()  # the worker rolls back at its next poll
            raise
        except sqlexec.Interrupted:
            return _interrupted(stop, ctx, effects)
        return _completed(ran, effects)


def _params(raw: Any) -> list[Any] | dict[str, Any] | None:
    def value(v: Any) -> Any:
        return bytes.fromhex(v["hex"]) if isinstance(v, dict) else v

    if raw is None:
        return None
    if isinstance(raw, list):
        return [value(v) for v in raw]
    return {k: value(v) for k, v in raw.items()}


def _summary(effects: SqlCallEffects) -> dict[str, Any]:
    found = effects.sql
    return {
        "statements": found.statements,
        "reads": sorted(found.reads),
        "writes": sorted(found.writes),
        "whole_db": found.whole_db.value if found.whole_db else None,
    }


def _completed(ran: sqlexec.Ran, effects: SqlCallEffects) -> ToolOutput:
    parts = []
    if ran.columns:
        parts.append(_table(ran.columns, ran.rows))
    if not effects.read_only or not ran.columns:
        parts.append(f"{ran.rows_changed} row(s) changed")
    structured = {
        "columns": ran.columns,
        "rows": ran.rows,
        "rows_changed": ran.rows_changed,
        **_summary(effects),
    }
    return ToolOutput(
        text="\n".join(parts),
        structured=structured,
        evidence=Evidence(path=str(effects.database)),
        truncated=ran.truncated,
    )


def _interrupted(stop: sqlexec.Stop, ctx: ToolContext, effects: SqlCallEffects) -> ToolOutput:
    if stop.why is ErrorClass.TIMEOUT:
        why, detail = ErrorClass.TIMEOUT, f"timeout after {ctx.timeout:g}s"
        message = f"timed out after {ctx.timeout:g}s; rolled back, nothing was committed"
    else:
        why, detail = ErrorClass.CANCELLED, ctx.cancel.reason or "cancelled"
        message = f"cancelled: {detail}; rolled back, nothing was committed"
    marks = (Mark(Phase.CANCEL_REQUESTED, stop.at or clock.now(), detail), mark(Phase.STOPPED))
    return ToolOutput(
        structured={"committed": False, **_summary(effects)},
        evidence=Evidence(path=str(effects.database)),
        error_class=why,
        message=message,
        stopped_how=StopMode.COOPERATIVE,
        marks=marks,
        rolled_back=True,
    )


def _table(columns: list[str], rows: list[list[Any]]) -> str:
    lines = ["\t".join(_cell(c) for c in columns)]
    lines.extend("\t".join(_cell(v) for v in row) for row in rows)
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, dict):  # a blob, already {"hex": ...}
        return f"x'{value['hex']}'"
    text = str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
