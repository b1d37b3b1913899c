"""Running the `sql` tool's statements on SQLite: blocking, in one worker thread.

One connection per call, closed at the end. Every statement of a call runs in
one transaction that this module opens and ends:

- read-only analysis: `PRAGMA query_only=ON`, BEGIN, statements, ROLLBACK -- a
  write the analysis missed fails instead of writing;
- otherwise: BEGIN IMMEDIATE, statements, COMMIT; any error rolls back.

Two engine hooks keep a call to what was analysed and scheduled:

- the progress handler polls `Stop` (cancel scope, deadline) every few thousand
  VM steps and aborts the statement; the transaction is then rolled back, so an
  interrupted call, even a writing one, provably committed nothing;
- the authorizer (`Guard`) refuses transaction control, ATTACH/DETACH (a file
  outside the workspace), pragmas other than introspection, and any table access
  the analysis did not clear (a trigger or view created after it, or a parser
  disagreement), so the tables the scheduler locked are the tables touched.

Exceptions, beside `ToolError` (typed failure, nothing committed):

    Interrupted        cancel or timeout seen by the progress handler; rolled back
    CommitUncertain    COMMIT (or a statement) ended the transaction in a way that
                       does not prove nothing was committed -> UNKNOWN_OUTCOME
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from execgate.executor.core import clock  # a module import: see tools/sql.py
from execgate.executor.core.errors import ExecgateError, ToolError
from execgate.executor.core.outcomes import ErrorClass
from execgate.executor.core.paths import Workspace, hard_link_refused
from execgate.executor.sandbox.ladder import CancelScope

from . import sqlanalysis, sqlconfine
from .sqlguard import Guard

# VM steps between two polls of the cancel scope and the deadline (~0.1 ms each).
PROGRESS_STEPS = 1000
# How long a statement or COMMIT waits for another connection's lock.
BUSY_SECONDS = 2.0
# How long one BEGIN IMMEDIATE attempt waits before the cancel scope is polled.
BEGIN_POLL_MS = 50
# Failures of the file or the system rather than of the SQL.
_IO_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_PERM,
    }
)
_DB = "arguments.database"


class Interrupted(ExecgateError):
    """The progress handler aborted the work (cancel or timeout); rolled back."""


class CommitUncertain(ExecgateError, RuntimeError):
    """The transaction ended without proof that nothing was committed; `message` says how."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """One call, ready to run."""

    path: Path  # canonical, inside the workspace
    create: bool
    statements: tuple[str, ...]
    params: list[Any] | dict[str, Any] | None
    max_rows: int
    byte_cap: int  # stop fetching once the rows take about this many JSON bytes
    effects: sqlanalysis.SqlEffects
    # May a database (or journal) file with several hard links at this canonical path
    # be used? The policy's `hard_links:`.
    hard_links_ok: Callable[[Path], bool] = lambda _path: False


@dataclass(slots=True)
class Ran:
    """What the statements produced: the last result set and the changes."""

    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    truncated: bool = False
    rows_changed: int = 0


class Stop:
    """Why the work must stop; polled from SQLite's progress handler.

    Invariant: `at` is non-zero exactly when `why` is set, and `why` never changes
    once set.
    """

    def __init__(self, cancel: CancelScope, deadline: float) -> None:
        self._cancel = cancel
        self._deadline = deadline  # time.monotonic()
        # Set from the event loop when the awaiting task itself is cancelled.
        self.aborted = threading.Event()
        self.why: ErrorClass | None = None
        self.at = 0.0  # wall clock when the stop was first seen

    def poll(self) -> bool:
        if self.why is not None:
            return True
        # Plain flag reads: safe from the worker thread without the loop.
        if self._cancel.requested.is_set() or self.aborted.is_set():
            self.why = ErrorClass.CANCELLED
        elif time.monotonic() > self._deadline:
            self.why = ErrorClass.TIMEOUT
        else:
            return False
        self.at = clock.now()
        return True

    def handler(self) -> int:
        return 1 if self.poll() else 0


def execute(plan: Plan, ws: Workspace, stop: Stop) -> Ran:
    """Run the plan's statements in one transaction; see the module docstring.

    Every file SQLite touches meanwhile is opened beneath the workspace root, no
    symlink followed (`sqlconfine`)."""
    links_ok = plan.hard_links_ok
    with sqlconfine.confined(ws.root, ws.fd, lambda rel: links_ok(ws.root / rel)) as scope:
        try:
            return _execute(plan, ws, stop)
        except ToolError as err:
            if scope.refused and err.error_class is ErrorClass.IO_ERROR:
                raise ToolError(
                    ErrorClass.PERMISSION_DENIED,
                    f"{err.message} (refused: {scope.refused[-1]})",
                    field=_DB,
                ) from err
            raise


def _execute(plan: Plan, ws: Workspace, stop: Stop) -> Ran:
    conn = _open(plan, ws)
    try:
        guard = Guard(plan.effects)
        conn.set_authorizer(guard)
        conn.set_progress_handler(stop.handler, PROGRESS_STEPS)
        _begin(conn, plan.effects.read_only, stop)
        guard.tables = _tables(conn)
        guard.armed = True
        try:
            ran = _statements(conn, plan, stop, guard)
        finally:
            guard.armed = False  # COMMIT and ROLLBACK are ours to send
        if plan.effects.read_only:
            _rollback(conn)  # nothing to keep
        else:
            _commit(conn)
        return ran
    except BaseException:
        _rollback(conn)
        raise
    finally:
        conn.close()


def _open(plan: Plan, ws: Workspace) -> sqlite3.Connection:
    st = ws.lstat(plan.path, _DB)
    rel = ws.relative(plan.path)
    if st is None:
        if not plan.create:
            msg = f"{rel} does not exist (set create to make a new database)"
            raise ToolError(ErrorClass.NOT_FOUND, msg, field=_DB)
        if ws.lstat(plan.path.parent, _DB) is None:
            msg = f"the directory of {rel} does not exist"
            raise ToolError(ErrorClass.NOT_FOUND, msg, field=_DB)
    elif not stat.S_ISREG(st.st_mode):
        msg = f"{rel} is not a regular file"
        raise ToolError(ErrorClass.INVALID_ARGUMENT, msg, field=_DB)
    elif st.st_nlink > 1 and not plan.hard_links_ok(plan.path):
        raise hard_link_refused(rel, st.st_nlink, _DB)
    created = st is None
    mode = "rwc" if plan.create else "rw"
    uri = f"file:{quote(str(plan.path), safe='/')}?mode={mode}"
    try:
        # Autocommit mode: this module issues BEGIN/COMMIT itself. No statement
        # cache, so every statement the call sends meets the authorizer.
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, cached_statements=0)
    except sqlite3.Error as exc:
        raise _translate(exc, "opening the database", plan) from exc
    # SQLite resolves symlinks itself; the file it opened must be the one checked.
    try:
        opened = {name: path for _, name, path in conn.execute("PRAGMA database_list")}
    except sqlite3.Error as exc:
        conn.close()
        raise _translate(exc, "opening the database", plan) from exc
    if opened.get("main") != str(plan.path):
        conn.close()
        msg = "the database path changed to point elsewhere while it was opened"
        raise ToolError(ErrorClass.PERMISSION_DENIED, msg, field=_DB)
    with contextlib.suppress(sqlite3.Error):
        # Temporary files would be made outside the workspace (sqlconfine refuses them).
        conn.execute("PRAGMA temp_store = MEMORY")
    if created:
        # New databases are made in WAL mode, where readers never block a writer's
        # COMMIT: the scheduler can then let readers and writers of different
        # tables run together (existing databases keep their mode).
        with contextlib.suppress(sqlite3.Error):
            conn.execute("PRAGMA journal_mode=WAL")
    return conn


def _begin(conn: sqlite3.Connection, read_only: bool, stop: Stop) -> None:
    try:
        # Off is SQLite's default; said explicitly because ON would let cascades
        # write tables the analysis never saw.
        conn.execute("PRAGMA foreign_keys = OFF")
        if read_only:
            conn.execute("PRAGMA query_only = ON")
            conn.execute("BEGIN")
        else:
            _begin_immediate(conn, stop)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_SECONDS * 1000)}")
    except sqlite3.Error as exc:
        raise _translate(exc, "starting the transaction", None, stop) from exc


def _tables(conn: sqlite3.Connection) -> frozenset[str]:
    try:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
        return frozenset(sqlanalysis.fold(name) for (name,) in rows)
    except sqlite3.Error as exc:
        raise _translate(exc, "reading the schema", None) from exc


def _begin_immediate(conn: sqlite3.Connection, stop: Stop) -> None:
    """Take the write lock, waiting for other writers as long as the call may."""
    conn.execute(f"PRAGMA busy_timeout = {BEGIN_POLL_MS}")
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if _primary(exc) != sqlite3.SQLITE_BUSY:
                raise
            if stop.poll():
                raise Interrupted from exc


def _statements(conn: sqlite3.Connection, plan: Plan, stop: Stop, guard: Guard) -> Ran:
    ran = Ran()
    before = conn.total_changes
    for number, text in enumerate(plan.statements, start=1):
        if stop.poll():
            raise Interrupted
        where = f"statement {number}"
        try:
            cur = conn.execute(text) if plan.params is None else conn.execute(text, plan.params)
            if cur.description is not None:
                ran.columns = [d[0] for d in cur.description]
                ran.rows, ran.truncated = _fetch(cur, plan.max_rows, plan.byte_cap)
            cur.close()
        except sqlite3.Error as exc:
            raise _translate(exc, where, plan, stop, guard) from exc
        except OverflowError as exc:  # an integer parameter beyond 64 bits
            msg = f"{where}: {exc}"
            raise ToolError(ErrorClass.INVALID_ARGUMENT, msg, field="arguments.params") from exc
        if not plan.effects.read_only and not conn.in_transaction:
            raise CommitUncertain(f"{where} ended the transaction")
    ran.rows_changed = conn.total_changes - before
    return ran


def _fetch(cur: sqlite3.Cursor, max_rows: int, byte_cap: int) -> tuple[list[list[Any]], bool]:
    """Rows up to `max_rows` or about `byte_cap` bytes; truncated only if a row was left."""
    rows: list[list[Any]] = []
    size = 0
    for row in cur:
        if len(rows) >= max_rows or size >= byte_cap:
            return rows, True
        values = [json_value(v) for v in row]
        size += len(json.dumps(values, ensure_ascii=False))
        rows.append(values)
    return rows, False


def json_value(value: Any) -> Any:
    """An SQLite value as JSON: blobs as {"hex": ...}, infinities as strings."""
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _commit(conn: sqlite3.Connection) -> None:
    # A transaction that reached COMMIT is not interrupted any more.
    conn.set_progress_handler(None, 0)
    try:
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if _primary(exc) == sqlite3.SQLITE_BUSY and conn.in_transaction:
            # COMMIT failed with the transaction still open: it can be rolled back.
            _rollback(conn)
            msg = "the database stayed locked by another connection at COMMIT; nothing committed"
            raise ToolError(ErrorClass.IO_ERROR, msg, field=_DB) from exc
        raise CommitUncertain(f"COMMIT failed: {exc}") from exc


def _rollback(conn: sqlite3.Connection) -> None:
    conn.set_progress_handler(None, 0)
    if conn.in_transaction:
        # If even ROLLBACK fails, closing the connection discards the transaction.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _primary(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _translate(
    exc: sqlite3.Error,
    where: str,
    plan: Plan | None,
    stop: Stop | None = None,
    guard: Guard | None = None,
) -> Exception:
    """sqlite's error, as the call's typed failure (the transaction is rolled back)."""
    code = _primary(exc)
    text = f"{where}: {exc}"
    if code == sqlite3.SQLITE_INTERRUPT and stop is not None and stop.why is not None:
        return Interrupted()
    if code == sqlite3.SQLITE_AUTH and guard is not None and guard.denial:
        return ToolError(ErrorClass.PERMISSION_DENIED, f"{where}: {guard.denial}")
    if code == sqlite3.SQLITE_READONLY and plan is not None and plan.effects.read_only:
        msg = f"{text} (the analysis found the query read-only; it ran with query_only)"
        return ToolError(ErrorClass.INVALID_ARGUMENT, msg, field="arguments.query")
    if code == sqlite3.SQLITE_NOTADB:
        return ToolError(ErrorClass.INVALID_ARGUMENT, text, field=_DB)
    if code == sqlite3.SQLITE_READONLY:  # the file or its directory is not writable
        return ToolError(ErrorClass.PERMISSION_DENIED, text, field=_DB)
    if code in _IO_CODES:
        return ToolError(ErrorClass.IO_ERROR, text, field=_DB)
    binding = isinstance(exc, sqlite3.ProgrammingError) and "bind" in str(exc).lower()
    return ToolError(
        ErrorClass.INVALID_ARGUMENT,
        text,
        field="arguments.params" if binding else "arguments.query",
    )
