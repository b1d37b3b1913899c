"""The `calls` and `refusals` tables on PostgreSQL (`base.CallStore`), with the same
rules as the SQLite journal's calls.py, and the daemon that runs each call.

A write may be attempted twice (db.py: the connection died inside COMMIT and the
commit had landed): an intent or finished row already there with this daemon's
request is this call's own, and an outcome already recorded equal to ours is ours.
An intent of a daemon that lost its lease (presence.py) is refused: it no longer
holds the locks it was granted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from execgate.executor.core import clock
from execgate.executor.core.outcomes import Outcome

from ..codec import call_record, outcome_to_json
from ..records import CallFilter, CallRecord, DuplicateCall, KeyTaken
from .db import Conn, PgDb, retried
from .presence import LeaseLost, Presence

RECORD_COLUMNS = (
    "run_id, call_id, batch_id, tool, arguments_json, request_hash, idempotency_key, agent, "
    "may_write, state, created_at, outcome_json, replay_of, decision_json, workspace"
)
_INSERT = (
    "INSERT INTO calls (run_id, call_id, batch_id, tool, arguments_json, request_hash, "
    "idempotency_key, agent, may_write, state, created_at, finished_at, status, "
    "outcome_json, raw_result, replay_of, decision_json, workspace, daemon) "
)


class PgCalls:
    """The calls of a PostgreSQL journal (`base.CallStore`)."""

    def __init__(self, db: PgDb, presence: Presence) -> None:
        self._db = db
        self._presence = presence
        # Intents written without waiting, by (run_id, call_id), until they land: the
        # call's outcome waits for its intent (the pool may run them on two connections).
        self._pending: dict[tuple[str, str], concurrent.futures.Future[Any]] = {}
        # notices.PgNotices.call_ended, set by the store: a keyed call's end is told to
        # the daemons whose retries wait for it (None: nobody to tell).
        self.call_ended: Callable[[Conn, str, str], Awaitable[None]] | None = None

    # -- writes ---------------------------------------------------------------

    async def record_intent(self, rec: CallRecord) -> None:
        """Durably record that a call that may write is about to start."""
        await self._db.write(lambda c: self._insert(c, rec, None, ""), durable=True, atomic=False)

    def begin_intent(self, rec: CallRecord) -> Started:
        """Start recording a writing call's intent durably, without waiting for it: its
        commit (synchronous_commit on: flushed on the server when COMMIT returns) runs
        on the db's loop while the caller prepares what nobody can see."""
        future = self._db.write_nowait(
            lambda c: self._insert(c, rec, None, ""),
            durable=True,
            atomic=False,
            expected=(DuplicateCall, KeyTaken, LeaseLost),
        )
        self._pend((rec.run_id, rec.call_id), future)
        return Started(future)

    def record_intent_nowait(self, rec: CallRecord) -> None:
        """Record a read-only call's start without waiting (nothing to reconcile)."""
        future = self._db.write_nowait(
            lambda c: self._insert(c, rec, None, ""),
            durable=False,
            atomic=False,
            expected=(DuplicateCall,),
        )
        self._pend((rec.run_id, rec.call_id), future)

    def _pend(self, slot: tuple[str, str], future: concurrent.futures.Future[Any]) -> None:
        """The call's outcome waits for this intent (`record_outcome`)."""
        self._pending[slot] = future
        future.add_done_callback(lambda f: self._landed(slot, f))

    def _landed(self, slot: tuple[str, str], future: concurrent.futures.Future[Any]) -> None:
        if self._pending.get(slot) is future:
            del self._pending[slot]

    async def record_outcome(
        self, run_id: str, call_id: str, outcome: Outcome, raw: str, *, durable: bool
    ) -> None:
        pending = self._pending.get((run_id, call_id))
        if pending is not None:
            await _settled(pending)
        text = outcome_to_json(outcome)

        async def write(conn: Conn) -> None:
            cur = await conn.execute(
                "UPDATE calls SET state='finished', finished_at=%s, status=%s, outcome_json=%s, "
                "raw_result=%s WHERE run_id=%s AND call_id=%s AND state='running' AND daemon=%s "
                "RETURNING agent, idempotency_key",
                (clock.now(), outcome.status.value, text, raw, run_id, call_id, self._me()),
            )
            row = await cur.fetchone()
            if row is not None:
                if row[1] is not None and self.call_ended is not None:
                    await self.call_ended(conn, row[0], row[1])
                return
            found = await _one(conn, "outcome_json", run_id, call_id)
            if not retried() or found is None or found[0] != text:  # not ours to finish
                raise DuplicateCall(run_id, call_id)

        await self._db.write(write, durable=durable, atomic=False)

    async def record_finished(self, rec: CallRecord, outcome: Outcome, raw: str = "") -> None:
        await self._db.write(
            lambda c: self._insert(c, rec, outcome, raw), durable=False, atomic=False
        )

    async def record_refusal(self, rec: CallRecord, outcome: Outcome) -> None:
        async def write(conn: Conn) -> None:
            await conn.execute(
                "INSERT INTO refusals (at, run_id, call_id, tool, error_class, message) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
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

        async def read(conn: Conn) -> CallRecord | None:
            row = await _one(conn, cols, run_id, call_id)
            return call_record(row) if row else None

        return await self._db.read(read)

    async def by_idempotency_key(self, agent: str, key: str) -> CallRecord | None:
        async def read(conn: Conn) -> CallRecord | None:
            cur = await conn.execute(
                f"SELECT {RECORD_COLUMNS} FROM calls WHERE agent=%s AND idempotency_key=%s",
                (agent, key),
            )
            row = await cur.fetchone()
            return call_record(row) if row else None

        return await self._db.read(read)

    async def list(self, flt: CallFilter) -> tuple[list[CallRecord], int]:
        """Records newest first, and the seq to continue below (0 = no more)."""
        where, params = _where(flt)

        async def read(conn: Conn) -> tuple[list[CallRecord], int]:
            cur = await conn.execute(
                f"SELECT seq, {RECORD_COLUMNS} FROM calls {where} ORDER BY seq DESC LIMIT %s",
                (*params, flt.limit + 1),
            )
            rows = await cur.fetchall()
            more = len(rows) > flt.limit
            rows = rows[: flt.limit]
            next_seq = rows[-1][0] if more and rows else 0
            return [call_record(r[1:]) for r in rows], next_seq

        return await self._db.read(read)

    # -- helpers ----------------------------------------------------------------

    def _me(self) -> int:
        return self._presence.daemon_id

    async def _insert(self, conn: Conn, rec: CallRecord, outcome: Outcome | None, raw: str) -> None:
        me = self._me()
        values = (
            rec.run_id,
            rec.call_id,
            rec.batch_id,
            rec.tool,
            rec.arguments_json,
            rec.request_hash,
            rec.idempotency_key or None,
            rec.agent,
            rec.may_write,
            "running" if outcome is None else "finished",
            rec.created_at,
            None if outcome is None else clock.now(),
            None if outcome is None else outcome.status.value,
            None if outcome is None else outcome_to_json(outcome),
            raw,
            rec.replay_of or None,
            rec.decision.to_json() if rec.decision is not None else None,
            rec.workspace,
            me,
        )
        try:
            cur = await conn.execute(_insert_sql(outcome is None, len(values)), (*values, me))
        except psycopg.errors.UniqueViolation as exc:  # the key: another daemon's call
            raise KeyTaken(rec.agent, rec.idempotency_key or "") from exc
        if cur.rowcount == 1:
            return
        found = await _one(
            conn, "daemon, request_hash, created_at, batch_id", rec.run_id, rec.call_id
        )
        if found is None:
            raise LeaseLost(me)
        if not retried() or tuple(found) != (me, rec.request_hash, rec.created_at, rec.batch_id):
            raise DuplicateCall(rec.run_id, rec.call_id)


def _insert_sql(fenced: bool, n: int) -> str:
    """The insert of a call's row; a running one is fenced: only a daemon holding its
    lease starts a call (it holds the call's locks). Its last parameter: the daemon."""
    marks = ", ".join(["%s"] * n)
    if fenced:
        body = f"SELECT {marks} WHERE {Presence.ALIVE_SQL}"
    else:
        body = f"SELECT {marks} WHERE %s IS NOT NULL"  # the same parameters either way
    return _INSERT + body + " ON CONFLICT ON CONSTRAINT calls_run_call DO NOTHING"


class Started:
    """An intent's durable write under way (`records.Durable`), on the db's loop: a worker
    thread blocks on its future, the daemon's loop awaits it."""

    def __init__(self, future: concurrent.futures.Future[None]) -> None:
        self._future = future

    def wait(self) -> None:
        """Block until committed (a worker thread; never the event loop's)."""
        self._future.result()

    async def done(self) -> None:
        """Await the commit on the event loop. Shielded: a waiter cancelled here must
        not cancel the write (wrap_future passes a cancel on to the db's task)."""
        await asyncio.shield(asyncio.wrap_future(self._future))


async def _settled(future: concurrent.futures.Future[Any]) -> None:
    """Wait for a write made without waiting, whatever became of it."""
    wrapped = asyncio.wrap_future(future)
    try:
        await wrapped
    except Exception:  # its failure shows as ours (no running row of our own)
        return


async def _one(conn: Conn, cols: str, run_id: str, call_id: str) -> tuple[Any, ...] | None:
    cur = await conn.execute(
        f"SELECT {cols} FROM calls WHERE run_id=%s AND call_id=%s", (run_id, call_id)
    )
    return await cur.fetchone()


def glob_like(pattern: str) -> str:
    """A * ? glob as a LIKE pattern (identity names hold no other glob character)."""
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%").replace("?", "_")


def owned_by(col: str, globs: tuple[str, ...]) -> tuple[str, list[str]]:
    """`col` matches one of the globs (never, for none)."""
    if not globs:
        return "false", []
    return "(" + " OR ".join(f"{col} LIKE %s" for _ in globs) + ")", [glob_like(g) for g in globs]


def _where(flt: CallFilter) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if flt.run_id:
        clauses.append("run_id = %s")
        params.append(flt.run_id)
    if flt.statuses:
        clauses.append("status = ANY(%s)")
        params.append([s.value for s in flt.statuses])
    if flt.tool:
        clauses.append("tool = %s")
        params.append(flt.tool)
    if flt.workspace:
        clauses.append("workspace = %s")
        params.append(flt.workspace)
    if flt.agents is not None:
        by_agent, p1 = owned_by("agent", flt.agents)
        by_owner, p2 = owned_by("owner", flt.agents)
        clauses.append(f"({by_agent} OR run_id IN (SELECT run_id FROM runs WHERE {by_owner}))")
        params.extend((*p1, *p2))
    for clause, value in (
        ("created_at >= %s", flt.since),
        ("finished_at >= %s", flt.finished_since),
        ("created_at < %s", flt.until),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    if flt.before_seq:
        clauses.append("seq < %s")
        params.append(flt.before_seq)
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", params
