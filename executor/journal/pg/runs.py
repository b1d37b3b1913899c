"""The `runs` and `run_events` tables on PostgreSQL (`base.RunRecordStore`), as the
SQLite ones (journal/runs.py).

Several daemons may append to one run: the run's row is locked (`FOR UPDATE`) in
each append's transaction and the events' primary key (run_id, seq) refuses a second
event of one seq, so two daemons can never both extend a history from the same
point. Each append and cancel request tells the other daemons (notices.py), whose
WatchRun streams and run rules follow.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg

from execgate.executor.core import clock
from execgate.executor.core.run import CancelAsk, Run
from execgate.executor.core.runstate import (
    TERMINAL,
    Breakage,
    BrokenHistory,
    State,
    Transition,
)

from ..records import RunClaim, RunConflict
from .calls import owned_by
from .db import Conn, PgDb, retried

_RUN_COLUMNS = (
    "run_id, goal, owner, limits_json, model, config_version, labels_json, state, reason, "
    "last_seq, created_at, updated_at, cancel_requester, cancel_reason, cancel_at, workspace"
)

Notify = Callable[[Conn, str], Awaitable[None]]


class PgRuns:
    """The runs and run events of a PostgreSQL journal (`base.RunRecordStore`)."""

    def __init__(self, db: PgDb, notify: Notify | None = None) -> None:
        self._db = db
        # notices.Notices.run_changed, set by the store (None: nobody to tell).
        self.notify = notify

    async def insert(self, run: Run) -> RunConflict | None:
        async def write(conn: Conn) -> RunConflict | None:
            # Serialise starts of one id with appends and with each other.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (run.run_id,)
            )
            others = sorted(await _agents_in(conn, run.run_id) - {run.owner})
            if others:
                return RunConflict(others=tuple(others))
            if await _insert_run(conn, run):
                await self._tell(conn, run.run_id)
                return None
            found = await _run_rows(conn, "WHERE run_id = %s", (run.run_id,))
            mine = found and (found[0].owner, found[0].created_at) == (run.owner, run.created_at)
            if retried() and mine:
                return None  # our own insert, retried after its commit landed unseen
            return RunConflict(exists=True)

        return await self._db.write(write, durable=True)

    async def append(self, run_id: str, events: list[Transition], *, durable: bool = True) -> Run:
        """Append `events` and move the run's row, in one transaction. Not `durable`: the
        lazy pool's `synchronous_commit = off` -- committed in the server (other daemons
        see it, a crash of this daemon keeps it) and in the server's one WAL before any
        later commit, so the next durable commit's flush makes it durable too."""

        async def write(conn: Conn) -> Run:
            await conn.execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
            if retried() and events and await _landed(conn, run_id, events):
                return (await _run_rows(conn, "WHERE run_id = %s", (run_id,)))[0]
            try:
                run = await _insert_events(conn, run_id, events)
            except psycopg.errors.UniqueViolation as exc:
                seq = events[0].seq if events else None
                why = "another daemon sharing the journal recorded this seq first"
                raise BrokenHistory(run_id, seq, Breakage.DUPLICATE, why) from exc
            await self._tell(conn, run_id)
            return run

        return await self._db.write(write, durable=durable)

    async def request_cancel(self, run_id: str, ask: CancelAsk) -> Run:
        async def write(conn: Conn) -> Run:
            await conn.execute(
                "UPDATE runs SET cancel_requester=%s, cancel_reason=%s, cancel_at=%s "
                "WHERE run_id=%s AND cancel_at IS NULL",
                (ask.requester, ask.reason, ask.at, run_id),
            )
            await self._tell(conn, run_id)
            return (await _run_rows(conn, "WHERE run_id = %s", (run_id,)))[0]

        return await self._db.write(write, durable=True)

    async def sync(self, run_id: str) -> None:
        """A durable write of the run's row: its commit flushes the server's WAL up to
        its own commit record, after every commit before it (an append told not durable
        among them). It must write: a transaction that changes nothing has no commit
        record and waits for no flush."""

        async def touch(conn: Conn) -> None:
            await conn.execute(
                "UPDATE runs SET updated_at = GREATEST(%s, updated_at + 0.000001) "
                "WHERE run_id = %s",
                (clock.now(), run_id),
            )

        await self._db.write(touch, durable=True, atomic=False)

    async def get(self, run_id: str) -> Run | None:
        found = await self._db.read(lambda c: _run_rows(c, "WHERE run_id = %s", (run_id,)))
        return found[0] if found else None

    async def events(self, run_id: str, after_seq: int = 0) -> list[Transition]:
        return await self._db.read(lambda c: _event_rows(c, run_id, after_seq))

    async def find(
        self,
        states: Sequence[str],
        owner: str,
        limit: int,
        owners: tuple[str, ...] | None = None,
    ) -> list[Run]:
        where, params = _list_filter(states, owner, owners)
        params.append(limit)
        return await self._db.read(
            lambda c: _run_rows(c, f"{where} ORDER BY created_at DESC LIMIT %s", tuple(params))
        )

    async def claim(self, run_id: str) -> RunClaim:
        async def read(conn: Conn) -> RunClaim:
            cur = await conn.execute("SELECT owner FROM runs WHERE run_id = %s", (run_id,))
            row = await cur.fetchone()
            agents = frozenset(await _agents_in(conn, run_id))
            return RunClaim(row[0] if row is not None else None, agents)

        return await self._db.read(read)

    def ended(self) -> dict[str, str]:
        async def read(conn: Conn) -> dict[str, str]:
            cur = await conn.execute(
                "SELECT run_id, state FROM runs WHERE state = ANY(%s)",
                ([s.value for s in TERMINAL],),
            )
            return {r[0]: r[1] for r in await cur.fetchall()}

        return self._db.read_now(read)

    def owners(self) -> dict[str, str]:
        async def read(conn: Conn) -> dict[str, str]:
            cur = await conn.execute("SELECT run_id, owner FROM runs")
            return {r[0]: r[1] for r in await cur.fetchall()}

        return self._db.read_now(read)

    def workspaces(self) -> dict[str, str]:
        async def read(conn: Conn) -> dict[str, str]:
            cur = await conn.execute("SELECT run_id, workspace FROM runs")
            return {r[0]: r[1] for r in await cur.fetchall()}

        return self._db.read_now(read)

    async def _tell(self, conn: Conn, run_id: str) -> None:
        if self.notify is not None:
            await self.notify(conn, run_id)


async def _agents_in(conn: Conn, run_id: str) -> set[str]:
    cur = await conn.execute(
        "SELECT agent FROM calls WHERE run_id = %s UNION SELECT requester FROM approvals "
        "WHERE run_id = %s",
        (run_id, run_id),
    )
    return {r[0] for r in await cur.fetchall()}


async def _insert_run(conn: Conn, r: Run) -> bool:
    cur = await conn.execute(
        f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES "
        "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, NULL, NULL, NULL, %s) "
        "ON CONFLICT (run_id) DO NOTHING",
        (
            r.run_id,
            r.goal,
            r.owner,
            json.dumps(r.limits),
            r.model,
            r.config_version,
            json.dumps(r.labels),
            r.state,
            r.reason,
            r.last_seq,
            r.created_at,
            r.updated_at,
            r.workspace,
        ),
    )
    return cur.rowcount == 1


async def _landed(conn: Conn, run_id: str, events: list[Transition]) -> bool:
    """Are these very events recorded already (our append, retried after its commit
    landed unseen)?"""
    last = events[-1]
    cur = await conn.execute(
        "SELECT at, to_state FROM run_events WHERE run_id = %s AND seq = %s", (run_id, last.seq)
    )
    row = await cur.fetchone()
    return row is not None and (row[0], row[1]) == (last.at, last.to_state.value)


async def _insert_events(conn: Conn, run_id: str, events: list[Transition]) -> Run:
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO run_events (run_id, seq, at, from_state, to_state, reason, data_json) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    run_id,
                    e.seq,
                    e.at,
                    e.from_state.value,
                    e.to_state.value,
                    e.reason,
                    json.dumps(e.data),
                )
                for e in events
            ],
        )
    if events:
        last = events[-1]
        await conn.execute(
            "UPDATE runs SET state=%s, reason=%s, last_seq=%s, updated_at=%s WHERE run_id=%s",
            (last.to_state.value, last.reason, last.seq, clock.now(), run_id),
        )
    return (await _run_rows(conn, "WHERE run_id = %s", (run_id,)))[0]


async def _run_rows(conn: Conn, where: str, params: tuple[Any, ...]) -> list[Run]:
    cur = await conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs {where}", params)
    return [_run(r) for r in await cur.fetchall()]


def _run(r: tuple[Any, ...]) -> Run:
    return Run(
        run_id=r[0],
        goal=r[1],
        owner=r[2],
        limits=json.loads(r[3]),
        model=r[4],
        config_version=r[5],
        labels=json.loads(r[6]),
        state=r[7],
        reason=r[8],
        last_seq=r[9],
        created_at=r[10],
        updated_at=r[11],
        cancel=CancelAsk(r[12], r[13], r[14]) if r[14] is not None else None,
        workspace=r[15],
    )


async def _event_rows(conn: Conn, run_id: str, after_seq: int) -> list[Transition]:
    cur = await conn.execute(
        "SELECT seq, at, from_state, to_state, reason, data_json FROM run_events "
        "WHERE run_id = %s AND seq > %s ORDER BY seq",
        (run_id, after_seq),
    )
    return [
        Transition(run_id, seq, at, State(f), State(t), reason, json.loads(data))
        for seq, at, f, t, reason, data in await cur.fetchall()
    ]


def _list_filter(
    states: Sequence[str], owner: str, owners: tuple[str, ...] | None = None
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if states:
        clauses.append("state = ANY(%s)")
        params.append(list(states))
    if owner:
        clauses.append("owner = %s")
        params.append(owner)
    if owners is not None:
        clause, globs = owned_by("owner", owners)
        clauses.append(clause)
        params.extend(globs)
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), params
