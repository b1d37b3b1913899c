"""A span exporter into the journal's span store: traces with no collector at all.

Runs in the batch span processor's thread and hands each batch of spans to the
journal (`SpanStore.add`: one transaction, not fsync'd: spans are a view of what the
calls' own durable records already say). A failure is logged and reported to the
SDK, never raised into a call.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from execgate.executor.journal.base import SpanStore
from execgate.executor.journal.records import SpanRecord

log = logging.getLogger("execgate.tracing")


class JournalSpanExporter(SpanExporter):
    def __init__(self, journal: SpanStore) -> None:
        self._journal = journal
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        rows = [_record(s) for s in spans]
        try:
            self._journal.add(rows)
        except Exception:
            log.exception("could not write %d span(s) to the journal", len(rows))
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._closed = True


def _record(s: ReadableSpan) -> SpanRecord:
    ctx = s.get_span_context()
    assert ctx is not None
    attrs = dict(s.attributes or {})
    events = [
        {"name": e.name, "at": e.timestamp / 1e9, "attributes": dict(e.attributes or {})}
        for e in s.events
    ]
    return SpanRecord(
        trace_id=format(ctx.trace_id, "032x"),
        span_id=format(ctx.span_id, "016x"),
        parent_id=format(s.parent.span_id, "016x") if s.parent is not None else "",
        name=s.name,
        start=(s.start_time or 0) / 1e9,
        end=(s.end_time or 0) / 1e9,
        status=s.status.status_code.name.lower(),
        run_id=str(attrs.get("execgate.run_id", "")),
        call_id=str(attrs.get("execgate.call_id", "")),
        attributes_json=json.dumps(attrs, default=list),
        events_json=json.dumps(events, default=list),
    )
