"""A span exporter into the journal's `spans` table: traces with no collector at all.

Runs in the batch span processor's thread and hands each batch of spans to the
journal's writer (one transaction, not fsync'd: spans are a view of what the
calls' own durable records already say). A failure is logged and reported to the
SDK, never raised into a call.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("execgate.tracing")


class JournalSpanExporter(SpanExporter):
    def __init__(self, journal: Any) -> None:
        self._journal = journal
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        rows = [_row(s) for s in spans]
        try:
            self._journal.write_from_thread(lambda c: _insert(c, rows))
        except Exception:
            log.exception("could not write %d span(s) to the journal", len(rows))
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._closed = True


def _row(s: ReadableSpan) -> tuple[Any, ...]:
    ctx = s.get_span_context()
    assert ctx is not None
    attrs = dict(s.attributes or {})
    events = [
        {"name": e.name, "at": e.timestamp / 1e9, "attributes": dict(e.attributes or {})}
        for e in s.events
    ]
    return (
        format(ctx.trace_id, "032x"),
        format(ctx.span_id, "016x"),
        format(s.parent.span_id, "016x") if s.parent is not None else "",
        s.name,
        (s.start_time or 0) / 1e9,
        (s.end_time or 0) / 1e9,
        s.status.status_code.name.lower(),
        str(attrs.get("execgate.run_id", "")),
        str(attrs.get("execgate.call_id", "")),
        json.dumps(attrs, default=list),
        json.dumps(events, default=list),
    )


def _insert(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    conn.executemany(
        "INSERT INTO spans (trace_id, span_id, parent_id, name, start, end, status, run_id, "
        "call_id, attributes_json, events_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
