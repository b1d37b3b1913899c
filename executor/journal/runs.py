"""The `runs` and `run_events` tables: rows in and out (executor/runs/registry.py decides).

`SqliteRuns` implements `base.RunRecordStore`. Every write is durable (but an append
told otherwise), and a run's row and its events change in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from execgate.executor.core import clock
from execgate.executor.core.run import CancelAsk, Run
from execgate.executor.core.runstate import TERMINAL, State, Transition

from .db import SqliteDb
from .records import RunClaim, RunConflict

_RUN_COLUMNS = (
    "run_id, goal, owner, limits_json, model, config_version, labels_json, state, reason, "
    "last_seq, created_at, updated_at, cancel_requester, cancel_reason, cancel_at, workspace"
)


class SqliteRuns:
    """The runs and run events of a SQLite journal (`base.RunRecordStore`)."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def insert(self, run: Run) -> RunConflict | None:
        """Insert `run`, durably, unless its id is taken (None: inserted). The check and
        the insert are one transaction."""

        def write(conn: sqlite3.Connection) -> RunConflict | None:
            # A run id other identities have used is theirs too: starting it would let
            # one agent claim (and then cancel) another's calls.
            others = sorted(_agents_in(conn, run.run_id) - {run.owner})
            if others:
                return RunConflict(others=tuple(others))
            return None if _insert_run(conn, run) else RunConflict(exists=True)

        return await self._db.write(write, durable=True)

    async def append(self, run_id: str, events: list[Transition], *, durable: bool = True) -> Run:
        """Append `events` and move the run's row to the last one, in one transaction
        (fsync'd if `durable`); the run as it now is."""
        return await self._db.write(lambda c: _insert_events(c, run_id, events), durable=durable)

    async def request_cancel(self, run_id: str, ask: CancelAsk) -> Run:
        """Record `ask` on the run unless one is recorded already (the first stands),
        durably; the run as it now is."""
        return await self._db.write(lambda c: _set_cancel(c, run_id, ask), durable=True)

    async def sync(self, run_id: str) -> None:
        """A durable write of the run's row: its fsync makes every write committed
        before it durable too (the WAL is one file, synced whole). The row must change --
        SQLite writes nothing, and syncs nothing, for an UPDATE to the same value."""

        def touch(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE runs SET updated_at = MAX(?, updated_at + 0.000001) WHERE run_id = ?",
                (clock.now(), run_id),
            )

        await self._db.write(touch, durable=True)

    async def get(self, run_id: str) -> Run | None:
        found = await self._db.read(lambda c: _run_rows(c, "WHERE run_id = ?", (run_id,)))
        return found[0] if found else None

    async def events(self, run_id: str, after_seq: int = 0) -> list[Transition]:
        """The run's events with seq above `after_seq`, in order."""
        return await self._db.read(lambda c: _event_rows(c, run_id, after_seq))

    async def find(
        self,
        states: Sequence[str],
        owner: str,
        limit: int,
        owners: tuple[str, ...] | None = None,
    ) -> list[Run]:
        """At most `limit` runs, newest first: in one of `states` (any if empty), of
        `owner` (any if ""), of an owner matching one of the * ? globs `owners` (any if
        None)."""
        where, params = _list_filter(states, owner, owners)
        params.append(limit)
        return await self._db.read(
            lambda c: _run_rows(c, f"{where} ORDER BY created_at DESC LIMIT ?", tuple(params))
        )

    async def claim(self, run_id: str) -> RunClaim:
        def read(conn: sqlite3.Connection) -> RunClaim:
            row = conn.execute("SELECT owner FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            return RunClaim(
                row[0] if row is not None else None, frozenset(_agents_in(conn, run_id))
            )

        return await self._db.read(read)

    def ended(self) -> dict[str, str]:
        """At startup: run id -> terminal state, of every run that ended."""
        return self._db.read_now(_ended_runs)

    def owners(self) -> dict[str, str]:
        """At startup: run id -> owner, of every started run."""
        return self._db.read_now(_owners)

    def workspaces(self) -> dict[str, str]:
        """At startup: run id -> the workspace it is bound to, of every started run."""
        return self._db.read_now(_workspaces)


def _agents_in(conn: sqlite3.Connection, run_id: str) -> set[str]:
    """The identities with calls, or calls parked for approval, recorded in `run_id`."""
    rows = conn.execute(
        "SELECT agent FROM calls WHERE run_id = ?1 "
        "UNION SELECT requester FROM approvals WHERE run_id = ?1",
        (run_id,),
    )
    return {r[0] for r in rows}


def _insert_run(conn: sqlite3.Connection, r: Run) -> bool:
    cur = conn.execute(
        f"INSERT OR IGNORE INTO runs ({_RUN_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL, ?)",
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


def _insert_events(conn: sqlite3.Connection, run_id: str, events: list[Transition]) -> Run:
    conn.executemany(
        "INSERT INTO run_events (run_id, seq, at, from_state, to_state, reason, data_json) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(run_id, e.seq, e.at, e.from_state, e.to_state, e.reason, _json(e)) for e in events],
    )
    if events:
        last = events[-1]
        conn.execute(
            "UPDATE runs SET state=?, reason=?, last_seq=?, updated_at=? WHERE run_id=?",
            (last.to_state.value, last.reason, last.seq, clock.now(), run_id),
        )
    return _run_rows(conn, "WHERE run_id = ?", (run_id,))[0]


def _json(e: Transition) -> str:
    return json.dumps(e.data)


def _set_cancel(conn: sqlite3.Connection, run_id: str, ask: CancelAsk) -> Run:
    conn.execute(
        "UPDATE runs SET cancel_requester=?, cancel_reason=?, cancel_at=? "
        "WHERE run_id=? AND cancel_at IS NULL",
        (ask.requester, ask.reason, ask.at, run_id),
    )
    return _run_rows(conn, "WHERE run_id = ?", (run_id,))[0]


def _run_rows(conn: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> list[Run]:
    rows = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs {where}", params).fetchall()
    return [_run(r) for r in rows]


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


def _event_rows(conn: sqlite3.Connection, run_id: str, after_seq: int) -> list[Transition]:
    rows = conn.execute(
        "SELECT seq, at, from_state, to_state, reason, data_json FROM run_events "
        "WHERE run_id = ? AND seq > ? ORDER BY seq",
        (run_id, after_seq),
    ).fetchall()
    return [
        Transition(run_id, seq, at, State(f), State(t), reason, json.loads(data))
        for seq, at, f, t, reason, data in rows
    ]


def _list_filter(
    states: Sequence[str], owner: str, owners: tuple[str, ...] | None = None
) -> tuple[str, list[Any]]:
    """`owners`: only runs of owners matching these names or * ? globs (None: all)."""
    clauses: list[str] = []
    params: list[Any] = []
    if states:
        clauses.append(f"state IN ({', '.join('?' * len(states))})")
        params.extend(states)
    if owner:
        clauses.append("owner = ?")
        params.append(owner)
    if owners is not None:
        clauses.append("(" + (" OR ".join("owner GLOB ?" for _ in owners) or "0") + ")")
        params.extend(owners)
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), params


def _owners(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT run_id, owner FROM runs").fetchall())


def _workspaces(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT run_id, workspace FROM runs").fetchall())


def _ended_runs(conn: sqlite3.Connection) -> dict[str, str]:
    terminal = [s.value for s in TERMINAL]
    rows = conn.execute(
        f"SELECT run_id, state FROM runs WHERE state IN ({', '.join('?' * len(terminal))})",
        terminal,
    )
    return dict(rows.fetchall())
