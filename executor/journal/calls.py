"""The `calls` and `refusals` tables: a call's intent, its outcome, and the refusals of
calls whose id was taken (executor/pipeline decides what they say).

`SqliteCalls` implements `base.CallStore`. Durability is the caller's choice per
write (`durable`: committed with fsync before the await returns); every write goes
through the group-commit writer.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from execgate.executor.core import clock
from execgate.executor.core.outcomes import Outcome

from .codec import call_record, outcome_to_json
from .db import SqliteDb
from .records import CallFilter, CallRecord, DuplicateCall, KeyTaken
from .schema import RECORD_COLUMNS
from .writer import Started


class SqliteCalls:
    """The calls of a SQLite journal (`base.CallStore`)."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    # -- writes ---------------------------------------------------------------

    async def record_intent(self, rec: CallRecord) -> None:
        """Durably record that a call that may write is about to start."""
        await self._db.write(lambda c: _insert(c, rec, None, ""), durable=True)

    def begin_intent(self, rec: CallRecord) -> Started[None]:
        """Start recording a writing call's intent durably, without waiting for it."""
        return self._db.write_started(lambda c: _insert(c, rec, None, ""), durable=True)

    def record_intent_nowait(self, rec: CallRecord) -> None:
        """Record a read-only call's start without waiting (nothing to reconcile).

        If the insert fails (its call id is taken), `record_outcome` finds no running
        row of its own and raises DuplicateCall.
        """
        self._db.write_nowait(
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

        await self._db.write(write, durable=durable)

    async def record_finished(self, rec: CallRecord, outcome: Outcome, raw: str = "") -> None:
        """A call that never ran (rejected) or was answered by replay: one row, done."""
        await self._db.write(lambda c: _insert(c, rec, outcome, raw), durable=False)

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

        await self._db.write(write, durable=False)

    # -- reads ----------------------------------------------------------------

    async def get(
        self, run_id: str, call_id: str, *, include_raw: bool = False
    ) -> CallRecord | None:
        cols = RECORD_COLUMNS + (", raw_result" if include_raw else "")

        def read(conn: sqlite3.Connection) -> CallRecord | None:
            row = conn.execute(
                f"SELECT {cols} FROM calls WHERE run_id=? AND call_id=?", (run_id, call_id)
            ).fetchone()
            return call_record(row) if row else None

        return await self._db.read(read)

    async def by_idempotency_key(self, agent: str, key: str) -> CallRecord | None:
        def read(conn: sqlite3.Connection) -> CallRecord | None:
            row = conn.execute(
                f"SELECT {RECORD_COLUMNS} FROM calls WHERE agent=? AND idempotency_key=?",
                (agent, key),
            ).fetchone()
            return call_record(row) if row else None

        return await self._db.read(read)

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
            return [call_record(r[1:]) for r in rows], next_seq

        return await self._db.read(read)


def _insert(conn: sqlite3.Connection, rec: CallRecord, outcome: Outcome | None, raw: str) -> None:
    try:
        conn.execute(
            "INSERT INTO calls (run_id, call_id, batch_id, tool, arguments_json, request_hash, "
            "idempotency_key, agent, may_write, state, created_at, finished_at, status, "
            "outcome_json, raw_result, replay_of, decision_json, workspace) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                rec.workspace,
            ),
        )
    except sqlite3.IntegrityError as exc:
        if "calls.run_id, calls.call_id" in str(exc):
            raise DuplicateCall(rec.run_id, rec.call_id) from exc
        if "calls.agent, calls.idempotency_key" in str(exc):
            raise KeyTaken(rec.agent, rec.idempotency_key) from exc
        raise


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
    if flt.workspace:
        clauses.append("workspace = ?")
        params.append(flt.workspace)
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
