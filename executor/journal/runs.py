"""The `runs` and `run_events` tables: rows in and out (executor/runs/registry.py decides)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from execgate.executor.core import clock
from execgate.executor.core.run import CancelAsk, Run
from execgate.executor.core.runstate import TERMINAL, State, Transition

_RUN_COLUMNS = (
    "run_id, goal, owner, limits_json, model, config_version, labels_json, state, reason, "
    "last_seq, created_at, updated_at, cancel_requester, cancel_reason, cancel_at"
)


def insert_run(conn: sqlite3.Connection, r: Run) -> bool:
    cur = conn.execute(
        f"INSERT OR IGNORE INTO runs ({_RUN_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL)",
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
        ),
    )
    return cur.rowcount == 1


def insert_events(conn: sqlite3.Connection, run_id: str, events: list[Transition]) -> Run:
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
    return run_rows(conn, "WHERE run_id = ?", (run_id,))[0]


def _json(e: Transition) -> str:
    return json.dumps(e.data)


def set_cancel(conn: sqlite3.Connection, run_id: str, ask: CancelAsk) -> Run:
    conn.execute(
        "UPDATE runs SET cancel_requester=?, cancel_reason=?, cancel_at=? "
        "WHERE run_id=? AND cancel_at IS NULL",
        (ask.requester, ask.reason, ask.at, run_id),
    )
    return run_rows(conn, "WHERE run_id = ?", (run_id,))[0]


def run_rows(conn: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> list[Run]:
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
    )


def event_rows(conn: sqlite3.Connection, run_id: str, after_seq: int) -> list[Transition]:
    rows = conn.execute(
        "SELECT seq, at, from_state, to_state, reason, data_json FROM run_events "
        "WHERE run_id = ? AND seq > ? ORDER BY seq",
        (run_id, after_seq),
    ).fetchall()
    return [
        Transition(run_id, seq, at, State(f), State(t), reason, json.loads(data))
        for seq, at, f, t, reason, data in rows
    ]


def list_filter(
    states: list[str], owner: str, owners: tuple[str, ...] | None = None
) -> tuple[str, list[Any]]:
    """`owners`: only runs of owners matching these names or * ? globs (None: all)."""
    clauses, params = [], []
    if "active" in states:
        states = [s for s in states if s != "active"] + [
            s.value for s in State if s not in TERMINAL
        ]
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


def owners(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT run_id, owner FROM runs").fetchall())


def ended_runs(conn: sqlite3.Connection) -> dict[str, str]:
    terminal = [s.value for s in TERMINAL]
    rows = conn.execute(
        f"SELECT run_id, state FROM runs WHERE state IN ({', '.join('?' * len(terminal))})",
        terminal,
    )
    return dict(rows.fetchall())


def agents_in(conn: sqlite3.Connection, run_id: str) -> set[str]:
    """The identities with calls, or calls parked for approval, recorded in `run_id`."""
    rows = conn.execute(
        "SELECT agent FROM calls WHERE run_id = ?1 "
        "UNION SELECT requester FROM approvals WHERE run_id = ?1",
        (run_id,),
    )
    return {r[0] for r in rows}
