"""The `policy_events` table: every version of a watched configuration file (the
policy, the identities) a running daemon was shown, accepted or refused
(executor/policy/watch.py decides which).

`SqliteReloads` implements `base.ReloadStore`.
"""

from __future__ import annotations

import sqlite3

from execgate.executor.core import clock

from .db import SqliteDb


class SqliteReloads:
    """The reload records of a SQLite journal (`base.ReloadStore`)."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def record(self, source: str, revision: str, *, accepted: bool, message: str) -> None:
        """Write one file version's fate (stamped now), durably."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO policy_events (at, source, revision, accepted, message) "
                "VALUES (?, ?, ?, ?, ?)",
                (clock.now(), source, revision, int(accepted), message),
            )

        await self._db.write(write, durable=True)
