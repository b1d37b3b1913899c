"""The `cancels` table: every Cancel request, recorded (durably) before anything is
signalled (executor/pipeline/inflight.py decides what is cancelled).

`SqliteCancels` implements `base.CancelStore`.
"""

from __future__ import annotations

import sqlite3

from .db import SqliteDb
from .records import CancelRecord


class SqliteCancels:
    """The cancel requests of a SQLite journal (`base.CancelStore`)."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def record(self, rec: CancelRecord) -> None:
        """Write the request, durably."""
        await self._db.write(lambda c: _insert(c, rec), durable=True)

    def barred_runs(self) -> dict[str, CancelRecord]:
        """At startup: run id -> the first whole-run cancel of each run ever cancelled."""
        return self._db.read_now(_barred_runs)


def _insert(conn: sqlite3.Connection, rec: CancelRecord) -> None:
    conn.execute(
        "INSERT INTO cancels (at, requester, reason, run_id, batch_id, call_id, grace) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (rec.at, rec.requester, rec.reason, rec.run_id, rec.batch_id, rec.call_id, rec.grace),
    )


def _barred_runs(conn: sqlite3.Connection) -> dict[str, CancelRecord]:
    # Bare columns beside MIN(at) come from the row holding the minimum (SQLite).
    rows = conn.execute(
        "SELECT run_id, MIN(at), reason, requester, grace FROM cancels "
        "WHERE run_id != '' AND call_id = '' AND batch_id = '' GROUP BY run_id"
    ).fetchall()
    return {
        run: CancelRecord(at=at, requester=requester, reason=reason, run_id=run, grace=grace)
        for run, at, reason, requester, grace in rows
    }
