"""Each memory bound of the daemon on its own (issue 13; the whole daemon under the
hostile corpus is tests/security/test_memory_bound.py).

    metrics     the tool label comes from the served tools: bogus names share one series
    tracing     span and event attribute values are cut to MAX_ATTRIBUTE_CHARS
    fanout      a watcher MAX_BACKLOG updates behind is ended (Lagging), its backlog freed
    runs        run locks live while used; state machines are capped and dropped at the end
    malloc      big freed buffers go back to the OS once the mmap threshold is pinned
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from execgate.client.loop.states import State, Transition
from execgate.executor.core.fanout import Closed, Fanout, Lagging
from execgate.executor.core.outcomes import ErrorClass, Mark, Outcome, Phase, Status
from execgate.executor.core.run import Run
from execgate.executor.journal.records import SpanRecord
from execgate.executor.journal.store import Journal
from execgate.executor.runs.registry import RunStore
from execgate.executor.runs.syncs import Durability
from execgate.executor.telemetry import metrics, tracing

# ---------------------------------------------------------------- metrics


def _series(reader: InMemoryMetricReader, name: str) -> list[dict[str, Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        dict(p.attributes or {})
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]


def test_bogus_tool_names_share_one_metric_series() -> None:
    reader = InMemoryMetricReader()
    m = metrics.setup("test", readers=[reader], tools=["noop", "read_file"])
    rejected = Outcome(status=Status.REJECTED, error_class=ErrorClass.UNKNOWN_TOOL, message="no")
    for i in range(3000):
        m.record(f"bogus_{i}", rejected)
    m.record("noop", Outcome(status=Status.SUCCESS, error_class=ErrorClass.NONE, message=""))
    tools = sorted({a["execgate.tool"] for a in _series(reader, "execgate.calls")})
    assert tools == ["noop", metrics.UNKNOWN_TOOL]
    m.shutdown()


def test_tool_labels_past_the_cap_share_the_other_bucket() -> None:
    served = [f"tool_{i:04d}" for i in range(metrics.MAX_TOOL_LABELS + 10)]
    m = metrics.Metrics(None, served)
    labels = {m.tool_label(t) for t in served}
    assert len(labels) == metrics.MAX_TOOL_LABELS + 1
    assert m.tool_label(served[-1]) == metrics.OTHER_TOOL
    assert m.tool_label("nope") == metrics.UNKNOWN_TOOL


# ---------------------------------------------------------------- tracing


def test_span_attribute_values_are_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    journal = _Spans()
    t = tracing.setup(journal=journal, instance="test")
    batch = t.batch_span((), "run", "b", "agent", 1)
    cancelled = Mark(Phase.CANCEL_REQUESTED, 2.0, "b" * 100_000)
    outcome = Outcome(
        Status.FAILURE, ErrorClass.CANCELLED, timeline=(Mark(Phase.QUEUED, 1.0), cancelled)
    )
    t.call_spans(batch, "run", "c", outcome, tracing.CallFacts(tool="a" * 100_000))
    batch.end()
    t.shutdown()  # flushes into the journal
    call = next(r for r in journal.rows if r.name == "execgate.call")
    assert len(json.loads(call.attributes_json)["execgate.tool"]) == tracing.MAX_ATTRIBUTE_CHARS
    detail = json.loads(call.events_json)[0]["attributes"]["detail"]
    assert len(detail) == tracing.MAX_ATTRIBUTE_CHARS


class _Spans:
    """A SpanStore that keeps the rows it is given."""

    def __init__(self) -> None:
        self.rows: list[SpanRecord] = []

    def add(self, spans: Sequence[SpanRecord]) -> None:
        self.rows.extend(spans)


# ---------------------------------------------------------------- fanout


def test_a_watcher_that_does_not_read_is_ended_and_its_backlog_freed() -> None:
    async def go() -> None:
        fan: Fanout[int] = Fanout(backlog=8)
        slow, quick = fan.subscribe(), fan.subscribe()
        got: list[int] = []
        for i in range(20):
            fan.publish(i)
            got.append(await quick.get())
        assert got == list(range(20))  # the reader gets everything, in order
        assert slow.backlog == 0  # dropped when it overflowed, not kept
        with pytest.raises(Lagging):
            await slow.get()
        assert fan.lagged == 1
        fan.close("stopping")
        with pytest.raises(Closed):
            await quick.get()
        fan.unsubscribe(slow)
        fan.unsubscribe(quick)
        assert len(fan) == 0

    asyncio.run(go())


# ---------------------------------------------------------------- runs


def _moves(run_id: str, n: int) -> list[Transition]:
    """The first `n` moves of a legal history: created, then model and validation in turn."""
    states = [State.CREATED] + [State.REQUESTING_MODEL, State.VALIDATING] * n
    return [
        Transition(run_id, seq, time.time(), states[seq - 1], states[seq], "", {})
        for seq in range(1, n + 1)
    ]


def test_run_locks_live_while_used_and_machines_are_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("execgate.executor.runs.registry.MAX_MACHINES", 5)

    async def go() -> RunStore:
        journal = Journal(tmp_path / "journal.db")
        store = RunStore(journal.runs)
        for i in range(12):
            run = await store.start(Run(run_id=f"r{i}", goal="", owner="bot"))
            moves = _moves(run.run_id, 2)  # two appends, the second waits for the lock
            await asyncio.gather(
                store.append(run.run_id, moves[:1], "bot"),
                store.append(run.run_id, moves[1:], "bot"),
            )
        assert store._locks == {}
        assert list(store._machines) == [f"r{i}" for i in range(7, 12)]
        # A dropped machine is replayed from the journal: the history still continues.
        await store.append("r0", _moves("r0", 3)[2:], "bot")
        end = Transition("r0", 4, time.time(), State.REQUESTING_MODEL, State.FAILED, "x", {})
        await store.append("r0", [end], "bot")
        assert "r0" not in store._machines  # an ended run's machine is never needed
        journal.close()
        return store

    asyncio.run(go())


def test_a_steps_sync_lives_until_its_fsync_is_done(tmp_path: Path) -> None:
    """A step's end leaves one fsync task per run, gone once the fsync succeeded."""

    async def go() -> None:
        journal = Journal(tmp_path / "journal.db")
        store = RunStore(journal.runs)
        for i in range(20):
            run = await store.start(Run(run_id=f"s{i}", goal="", owner="bot"))
            path = [State.CREATED, State.REQUESTING_MODEL, State.VALIDATING, State.RUNNING_TOOLS]
            moves = [
                Transition(run.run_id, n, time.time(), path[n - 1], path[n], "", {})
                for n in (1, 2, 3)
            ]
            await store.open_step(run.run_id, moves, "bot")
            await store.step_move(run.run_id, 3, _closing(run.run_id), Durability.SOON)
        await store.drain()
        assert len(store.syncs) == 0
        journal.close()

    asyncio.run(go())


def _closing(run_id: str) -> Callable[[State, int], list[Transition]]:
    def close(state: State, seq: int) -> list[Transition]:
        return [Transition(run_id, seq, time.time(), state, State.REQUESTING_MODEL, "done", {})]

    return close


# ---------------------------------------------------------------- malloc

_FRAGMENT = """
import json, sys, psutil
from execgate.executor.server import malloc
if sys.argv[1] == "pin":
    assert malloc.pin_mmap_threshold()
keep = []
for _ in range(3):
    big = [bytearray(1 << 20) for _ in range(64)]
    for b in big:
        b[::4096] = b"x" * len(b[::4096])  # touch every page
    keep.extend(bytearray(1024) for _ in range(64))
    del big, b
print(json.dumps(psutil.Process().memory_info().rss))
"""


def _rss_after(mode: str, **env: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _FRAGMENT, mode],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    return int(json.loads(out.stdout))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_freed_big_buffers_go_back_to_the_os_once_the_threshold_is_pinned() -> None:
    pinned, dynamic = _rss_after("pin"), _rss_after("default")
    mib = 1 << 20
    # 64 MiB were allocated and freed three times; pinned, they are unmapped.
    assert pinned < dynamic - 32 * mib, (pinned / mib, dynamic / mib)


def test_the_operators_malloc_tuning_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from execgate.executor.server import malloc

    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert malloc.pin_mmap_threshold() is False
