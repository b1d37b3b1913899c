"""Cancels, config reloads and spans on PostgreSQL (`base.CancelStore`,
`base.ReloadStore`, `base.SpanStore`), as the SQLite ones (cancels.py, reloads.py,
spans.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from execgate.executor.core import clock

from ..records import CancelRecord, SpanRecord
from .db import Conn, PgDb


class PgCancels:
    """The cancel requests of a PostgreSQL journal (`base.CancelStore`)."""

    def __init__(self, db: PgDb) -> None:
        self._db = db
        # notices.Notices.cancelled, set by the store (None: nobody to tell).
        self.notify: Callable[[Conn, CancelRecord], Awaitable[None]] | None = None

    async def record(self, rec: CancelRecord) -> None:
        async def write(conn: Conn) -> None:
            await conn.execute(
                "INSERT INTO cancels (at, requester, reason, run_id, batch_id, call_id, grace) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (
                    rec.at,
                    rec.requester,
                    rec.reason,
                    rec.run_id,
                    rec.batch_id,
                    rec.call_id,
                    rec.grace,
                ),
            )
            if self.notify is not None:
                await self.notify(conn, rec)

        await self._db.write(write, durable=True)

    def barred_runs(self) -> dict[str, CancelRecord]:
        async def read(conn: Conn) -> dict[str, CancelRecord]:
            cur = await conn.execute(
                "SELECT DISTINCT ON (run_id) run_id, at, reason, requester, grace FROM cancels "
                "WHERE run_id != '' AND call_id = '' AND batch_id = '' ORDER BY run_id, at, seq"
            )
            return {
                run: CancelRecord(at=at, requester=who, reason=reason, run_id=run, grace=grace)
                for run, at, reason, who, grace in await cur.fetchall()
            }

        return self._db.read_now(read)


class PgReloads:
    """The reload records of a PostgreSQL journal (`base.ReloadStore`)."""

    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def record(self, source: str, revision: str, *, accepted: bool, message: str) -> None:
        async def write(conn: Conn) -> None:
            await conn.execute(
                "INSERT INTO policy_events (at, source, revision, accepted, message) "
                "VALUES (%s, %s, %s, %s, %s)",
                (clock.now(), source, revision, accepted, message),
            )

        await self._db.write(write, durable=True)


class PgSpans:
    """The spans of a PostgreSQL journal (`base.SpanStore`)."""

    def __init__(self, db: PgDb) -> None:
        self._db = db

    def add(self, spans: Sequence[SpanRecord]) -> None:
        rows = [
            (
                s.trace_id,
                s.span_id,
                s.parent_id,
                s.name,
                s.start,
                s.end,
                s.status,
                s.run_id,
                s.call_id,
                s.attributes_json,
                s.events_json,
            )
            for s in spans
        ]

        async def write(conn: Conn) -> None:
            async with conn.cursor() as cur:
                await cur.executemany(
                    'INSERT INTO spans (trace_id, span_id, parent_id, name, start, "end", status, '
                    "run_id, call_id, attributes_json, events_json) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    rows,
                )

        self._db.write_sync(write, durable=False)
