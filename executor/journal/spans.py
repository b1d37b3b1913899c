"""The `spans` table: the daemon's OpenTelemetry spans, so traces need no collector
(executor/telemetry/journal_exporter.py turns SDK spans into `SpanRecord`s).

`SqliteSpans` implements `base.SpanStore`. Spans are a view of what the calls' own
durable records already say: written without fsync.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from .db import SqliteDb
from .records import SpanRecord


class SqliteSpans:
    """The spans of a SQLite journal (`base.SpanStore`)."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    def add(self, spans: Sequence[SpanRecord]) -> None:
        """Write `spans` in one transaction (not fsync'd) and block until committed:
        for threads other than the event loop's (the span processor's)."""
        rows = [_row(s) for s in spans]
        self._db.write_sync(lambda c: _insert(c, rows), durable=False)


def _row(s: SpanRecord) -> tuple[object, ...]:
    return (
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


def _insert(conn: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    conn.executemany(
        "INSERT INTO spans (trace_id, span_id, parent_id, name, start, end, status, run_id, "
        "call_id, attributes_json, events_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
