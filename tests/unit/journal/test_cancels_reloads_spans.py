"""CancelStore, ReloadStore and SpanStore on SQLite."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from execgate.executor.journal.records import CancelRecord, SpanRecord
from execgate.executor.journal.store import Journal

from .conftest import open_at, rows


def test_cancels_are_recorded_and_each_runs_first_whole_run_cancel_bars_it(path: Path) -> None:
    whole_late = CancelRecord(at=9.0, requester="ann", reason="again", run_id="r1", grace=1.0)
    whole = CancelRecord(at=5.0, requester="olga", reason="stop", run_id="r1", grace=2.5)
    one_call = CancelRecord(at=1.0, requester="bot", reason="x", run_id="r2", call_id="c1")
    a_batch = CancelRecord(at=1.0, requester="bot", reason="x", run_id="r3", batch_id="b")
    any_run = CancelRecord(at=1.0, requester="bot", reason="x", run_id="", batch_id="b")

    async def write() -> None:
        j = open_at(path)
        try:
            for rec in (whole_late, whole, one_call, a_batch, any_run):
                await j.cancels.record(rec)
        finally:
            j.close()

    asyncio.run(write())
    assert len(rows(path, "SELECT * FROM cancels")) == 5
    assert rows(path, "SELECT requester, grace FROM cancels WHERE call_id='c1'") == [("bot", None)]
    j = open_at(path)  # the next daemon keeps the bar
    try:
        assert j.cancels.barred_runs() == {"r1": whole}
    finally:
        j.close()


def test_reloads_are_recorded_accepted_or_refused_in_order(journal: Journal, path: Path) -> None:
    async def go() -> None:
        await journal.reloads.record("/etc/p.yaml", "rev1", accepted=True, message="accepted")
        await journal.reloads.record("/etc/p.yaml", "", accepted=False, message="p.yaml:3:1: bad")

    asyncio.run(go())
    assert rows(
        path, "SELECT source, revision, accepted, message FROM policy_events ORDER BY seq"
    ) == [
        ("/etc/p.yaml", "rev1", 1, "accepted"),
        ("/etc/p.yaml", "", 0, "p.yaml:3:1: bad"),
    ]
    (at,) = rows(path, "SELECT at FROM policy_events WHERE revision='rev1'")[0]
    assert at > 0


def _span(span_id: str, parent: str = "") -> SpanRecord:
    return SpanRecord(
        trace_id="0" * 31 + "1",
        span_id=span_id,
        parent_id=parent,
        name="execgate.call" if not parent else "execgate.sandbox",
        start=1.0,
        end=2.0,
        status="ok",
        run_id="r",
        call_id="c",
        attributes_json='{"execgate.run_id": "r"}',
        events_json="[]",
    )


def test_spans_are_added_from_another_thread_in_one_batch(journal: Journal, path: Path) -> None:
    # As the span processor does: its own thread, blocking until committed.
    done: list[BaseException | None] = []

    def export() -> None:
        try:
            journal.spans.add([_span("a" * 16), _span("b" * 16, parent="a" * 16)])
            done.append(None)
        except BaseException as exc:
            done.append(exc)

    worker = threading.Thread(target=export)
    worker.start()
    worker.join(timeout=30)
    assert done == [None]
    assert rows(
        path, "SELECT span_id, parent_id, name, run_id, call_id FROM spans ORDER BY seq"
    ) == [
        ("a" * 16, "", "execgate.call", "r", "c"),
        ("b" * 16, "a" * 16, "execgate.sandbox", "r", "c"),
    ]
