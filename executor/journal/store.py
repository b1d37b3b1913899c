"""The journal: the durable record of every call (SQLite, WAL, synchronous=FULL).

Write rules, which crash recovery relies on:
- a call's intent (row in state 'running') is committed before the call starts;
  for a call that may write, with fsync (durable); for a read-only call, in the
  same transaction group without forcing an fsync (nothing to reconcile);
- its outcome is committed before it is reported to anyone;
- at startup, `recover` turns every 'running' row into UNKNOWN_OUTCOME (may
  write) or FAILURE/interrupted (read-only). Nothing is dropped or marked done.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from execgate.executor.core import clock
from execgate.executor.core.errors import ExecgateError
from execgate.executor.core.outcomes import Outcome, Status

from .codec import outcome_from_json, outcome_to_json
from .recover import recover_running
from .schema import RECORD_COLUMNS, migrate
from .writer import SqliteWriter

log = logging.getLogger("execgate.journal")

T = TypeVar("T")


class DuplicateCall(ExecgateError):
    """The (run_id, call_id) pair is already in the journal."""

    def __init__(self, run_id: str, call_id: str) -> None:
        super().__init__(f"call_id {call_id!r} is already used in run {run_id!r}")
        self.run_id = run_id
        self.call_id = call_id


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """The policy decision a call got: what, by which rules, under which file revision."""

    effect: str
    rule_ids: tuple[str, ...]
    revision: str
    # Rules in shadow mode that matched (logged, not enforced), as "id:effect".
    shadow: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "effect": self.effect,
                "rules": self.rule_ids,
                "revision": self.revision,
                "shadow": self.shadow,
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(text: str) -> PolicyRecord:
        d = json.loads(text)
        return PolicyRecord(d["effect"], tuple(d["rules"]), d["revision"], tuple(d["shadow"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    run_id: str
    call_id: str
    batch_id: str
    tool: str
    arguments_json: str
    request_hash: str
    idempotency_key: str
    agent: str
    may_write: bool
    created_at: float
    # None while the call is running.
    outcome: Outcome | None = None
    replay_of: str = ""
    raw_result: str = ""
    decision: PolicyRecord | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFilter:
    run_id: str = ""
    statuses: tuple[Status, ...] = ()
    tool: str = ""
    since: float | None = None
    until: float | None = None
    # Only finished calls whose outcome was recorded at or after this time.
    finished_since: float | None = None
    limit: int = 100
    # Only records with seq below this (paging, newest first); 0 = no bound.
    before_seq: int = 0
    # Only calls made by agents matching these names or * ? globs, or made in runs
    # such agents own (scope.Scope); None = all.
    agents: tuple[str, ...] | None = None


class Journal:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        existed = self.path.exists()
        conn = _connect(self.path)
        try:
            applied = migrate(conn)
        except BaseException:
            conn.close()
            raise
        for step in applied if existed else ():
            log.info("journal %s: migrated to schema %d: %s", self.path, step.version, step.what)
        self._writer = SqliteWriter(conn)
        self._local = threading.local()

    def close(self) -> None:
        self._writer.close()

    # -- writes ---------------------------------------------------------------

    async def record_intent(self, rec: CallRecord) -> None:
        """Durably record that a call that may write is about to start."""
        await self._writer.submit(lambda c: _insert(c, rec, None, ""), durable=True)

    def record_intent_nowait(self, rec: CallRecord) -> None:
        """Record a read-only call's start without waiting (nothing to reconcile).

        If the insert fails (its call id is taken), `record_outcome` finds no running
        row of its own and raises DuplicateCall.
        """
        self._writer.submit_nowait(
            lambda c: _insert(c, rec, None, ""), durable=False, expected=(DuplicateCall,)
        )

    async def record_outcome(
        self, run_id: str, call_id: str, outcome: Outcome, raw: str, *, durable: bool
    ) -> None:
        def write(conn: sqlite3.Connection) -> None:
            updated = conn.execute(
                "UPDATE calls SET state='finished', finished_at=?, status=?, outcome_json=?, "
                "raw_result=? WHERE run_id=? AND call_id=? AND state='running'",
                (clock.now(), outcome.status.value, outcome_to_json(outcome), raw, run_id, call_id),
            ).rowcount
            if updated != 1:  # our intent never landed: the id belongs to another call
                raise DuplicateCall(run_id, call_id)

        await self._writer.submit(write, durable=durable)

    async def record_finished(self, rec: CallRecord, outcome: Outcome, raw: str = "") -> None:
        """A call that never ran (rejected) or was answered by replay: one row, done."""
        await self._writer.submit(lambda c: _insert(c, rec, outcome, raw), durable=False)

    async def record_refusal(self, rec: CallRecord, outcome: Outcome) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO refusals (at, run_id, call_id, tool, error_class, message) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    clock.now(),
                    rec.run_id,
                    rec.call_id,
                    rec.tool,
                    outcome.error_class.value,
                    outcome.message,
                ),
            )

        await self._writer.submit(write, durable=False)

    async def write(self, fn: Callable[[sqlite3.Connection], T], *, durable: bool) -> T:
        """Run `fn` in the writer's transaction (for the journal's other tables)."""
        return await self._writer.submit(fn, durable=durable)

    def write_now(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in the writer's transaction, durably, and wait (startup only)."""
        return self._writer.submit_sync(fn, durable=True)

    def write_from_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in the writer's transaction, not fsync'd, and wait: for threads
        other than the event loop's (span exporters)."""
        return self._writer.submit_sync(fn, durable=False)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run a read of the journal's other tables in a worker thread."""
        return await self._read(fn)

    def query_now(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run a read on the calling thread (startup only)."""
        return fn(self._reader())

    def recover(self) -> int:
        """Settle calls a previous daemon left running. Returns how many."""
        return self._writer.submit_sync(recover_running, durable=True)

    # -- reads ----------------------------------------------------------------

    async def get(
        self, run_id: str, call_id: str, *, include_raw: bool = False
    ) -> CallRecord | None:
        cols = RECORD_COLUMNS + (", raw_result" if include_raw else "")

        def read(conn: sqlite3.Connection) -> CallRecord | None:
            row = conn.execute(
                f"SELECT {cols} FROM calls WHERE run_id=? AND call_id=?", (run_id, call_id)
            ).fetchone()
            return _record(row) if row else None

        return await self._read(read)

    async def by_idempotency_key(self, agent: str, key: str) -> CallRecord | None:
        def read(conn: sqlite3.Connection) -> CallRecord | None:
            row = conn.execute(
                f"SELECT {RECORD_COLUMNS} FROM calls WHERE agent=? AND idempotency_key=?",
                (agent, key),
            ).fetchone()
            return _record(row) if row else None

        return await self._read(read)

    async def list(self, flt: CallFilter) -> tuple[list[CallRecord], int]:
        """Records newest first, and the seq to continue below (0 = no more)."""
        where, params = _where(flt)

        def read(conn: sqlite3.Connection) -> tuple[list[CallRecord], int]:
            rows = conn.execute(
                f"SELECT seq, {RECORD_COLUMNS} FROM calls {where} ORDER BY seq DESC LIMIT ?",
                (*params, flt.limit + 1),
            ).fetchall()
            more = len(rows) > flt.limit
            rows = rows[: flt.limit]
            next_seq = rows[-1][0] if more and rows else 0
            return [_record(r[1:]) for r in rows], next_seq

        return await self._read(read)

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(lambda: fn(self._reader()))

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path)
            self._local.conn = conn
        return conn


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def insert_call(conn: sqlite3.Connection, rec: CallRecord, outcome: Outcome) -> None:
    """Insert a finished call inside another write (startup settling parked calls)."""
    _insert(conn, rec, outcome, "")


def _insert(conn: sqlite3.Connection, rec: CallRecord, outcome: Outcome | None, raw: str) -> None:
    try:
        conn.execute(
            "INSERT INTO calls (run_id, call_id, batch_id, tool, arguments_json, request_hash, "
            "idempotency_key, agent, may_write, state, created_at, finished_at, status, "
            "outcome_json, raw_result, replay_of, decision_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                rec.run_id,
                rec.call_id,
                rec.batch_id,
                rec.tool,
                rec.arguments_json,
                rec.request_hash,
                rec.idempotency_key or None,
                rec.agent,
                int(rec.may_write),
                "running" if outcome is None else "finished",
                rec.created_at,
                None if outcome is None else clock.now(),
                None if outcome is None else outcome.status.value,
                None if outcome is None else outcome_to_json(outcome),
                raw,
                rec.replay_of or None,
                rec.decision.to_json() if rec.decision is not None else None,
            ),
        )
    except sqlite3.IntegrityError as exc:
        if "calls.run_id, calls.call_id" in str(exc):
            raise DuplicateCall(rec.run_id, rec.call_id) from exc
        raise


def _record(row: tuple[Any, ...]) -> CallRecord:
    (
        run_id,
        call_id,
        batch_id,
        tool,
        args,
        req_hash,
        key,
        agent,
        may_write,
        _state,
        created_at,
        outcome_json,
        replay_of,
        decision_json,
        *raw,
    ) = row
    return CallRecord(
        run_id=run_id,
        call_id=call_id,
        batch_id=batch_id,
        tool=tool,
        arguments_json=args,
        request_hash=req_hash,
        idempotency_key=key or "",
        agent=agent,
        may_write=bool(may_write),
        created_at=created_at,
        outcome=outcome_from_json(outcome_json) if outcome_json else None,
        replay_of=replay_of or "",
        raw_result=(raw[0] or "") if raw else "",
        decision=PolicyRecord.from_json(decision_json) if decision_json else None,
    )


def _where(flt: CallFilter) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if flt.run_id:
        clauses.append("run_id = ?")
        params.append(flt.run_id)
    if flt.statuses:
        clauses.append(f"status IN ({', '.join('?' * len(flt.statuses))})")
        params.extend(s.value for s in flt.statuses)
    if flt.tool:
        clauses.append("tool = ?")
        params.append(flt.tool)
    if flt.agents is not None:
        # GLOB: * and ? as fnmatch; identity names hold no other glob character.
        who = " OR ".join("{col} GLOB ?" for _ in flt.agents) or "0"
        clauses.append(
            f"({who.format(col='agent')} OR run_id IN "
            f"(SELECT run_id FROM runs WHERE {who.format(col='owner')}))"
        )
        params.extend((*flt.agents, *flt.agents))
    if flt.since is not None:
        clauses.append("created_at >= ?")
        params.append(flt.since)
    if flt.finished_since is not None:
        clauses.append("finished_at >= ?")
        params.append(flt.finished_since)
    if flt.until is not None:
        clauses.append("created_at < ?")
        params.append(flt.until)
    if flt.before_seq:
        clauses.append("seq < ?")
        params.append(flt.before_seq)
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", params
