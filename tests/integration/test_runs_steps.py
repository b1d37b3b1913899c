"""The run store's side of a loop step (RunStore.open_step, step_move, and the step's
moves as a handler records them: pipeline/runstep.py) under the interleavings a daemon
meets: a retried opening, two handlers of one step (a client's retry racing the
original) recording its approval waits and its end, a run moved on meanwhile. Real
journal (SQLite) in a temporary dir; calls are stand-in requests, the batch events made
by hand (the dispatcher is not part of these)."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from execgate.client.loop.states import Machine, State
from execgate.executor.core.approval import Approval, ApprovalState
from execgate.executor.core.outcomes import Outcome, Status
from execgate.executor.core.requests import CallRequest
from execgate.executor.core.run import Run
from execgate.executor.core.runstate import Transition
from execgate.executor.journal.store import Journal
from execgate.executor.pipeline.events import Event, EventKind
from execgate.executor.pipeline.runstep import StepMoves
from execgate.executor.runs.registry import Refusal, RunRefused, RunStore
from tests.daemon import scaled


def _calls(n: int) -> list[CallRequest]:
    return [
        CallRequest(
            run_id="r",
            call_id=f"s1c{i + 1}",
            batch_id="b",
            index=i,
            tool="noop",
            arguments_json="{}",
        )
        for i in range(n)
    ]


def _event(kind: EventKind, i: int, outcome: Outcome | None = None) -> Event:
    approval = None
    if kind is EventKind.AWAITING_APPROVAL:
        approval = Approval(
            id=f"ap{i}", run_id="r", call_id=f"s1c{i + 1}", batch_id="b", tool="noop",
            arguments_json="{}", requester="bot", rule_id="touches", reason="a human",
            approvers=("alice",), created_at=1.0, expires_at=2.0, state=ApprovalState.PENDING,
        )  # fmt: skip
    return Event(kind, f"s1c{i + 1}", "b", 1.0, i, outcome=outcome, approval=approval)


DONE = Outcome(status=Status.SUCCESS)


async def _opened(store: RunStore, run_id: str = "r") -> tuple[Machine, list[Any]]:
    await store.start(Run(run_id=run_id, goal="g", owner="bot"))
    m = Machine(run_id)
    await store.append(run_id, [m.advance(State.REQUESTING_MODEL, "go")], "bot")
    opening = [
        m.advance(State.VALIDATING, "model replied", {"turn": {"n": 1}}),
        m.advance(State.RUNNING_TOOLS, "1 call(s) sent", {"calls": ["s1c1"]}),
    ]
    return m, opening


def test_a_retried_opening_is_recognised_and_a_changed_one_refused(tmp_path: Path) -> None:
    async def main() -> None:
        store = RunStore(Journal(tmp_path / "j.db").runs)
        _, opening = await _opened(store)
        first = await store.open_step("r", opening, "bot")
        again = await store.open_step("r", opening, "bot")  # a retry: nothing appended
        assert first.last_seq == again.last_seq == 3
        assert len(await store.events("r")) == 3
        changed = [opening[0], dataclasses.replace(opening[1], data={"calls": []})]
        with pytest.raises(RunRefused) as refused:
            await store.open_step("r", changed, "bot")
        assert refused.value.kind is Refusal.DUPLICATE
        with pytest.raises(RunRefused) as foreign:
            await store.open_step("r", opening, "bob")
        assert foreign.value.kind is Refusal.FORBIDDEN
        with pytest.raises(RunRefused) as missing:
            await store.open_step("nope", opening, "bot")
        assert missing.value.kind is Refusal.NOT_FOUND

    asyncio.run(main())


def test_two_handlers_of_one_step_record_its_waits_and_its_end_once(tmp_path: Path) -> None:
    """Both see call 0 parked, both see it start and finish: one awaiting_approval, one
    move back, one end, and both handlers hold the same record."""

    async def handler(step: StepMoves) -> list[Transition]:
        for kind in (EventKind.AWAITING_APPROVAL, EventKind.STARTED):
            await step.on_event(_event(kind, 0))
        await step.on_event(_event(EventKind.FINISHED, 0, DONE))
        await step.end()
        return step.recorded

    async def main() -> tuple[list[Transition], list[Transition], list[Transition]]:
        store = RunStore(Journal(tmp_path / "j.db").runs)
        _, opening = await _opened(store)
        await store.open_step("r", opening, "bot")
        steps = [StepMoves(store, "r", _calls(1), seen=3) for _ in range(2)]
        a, b = await asyncio.gather(*(handler(s) for s in steps))
        return a, b, await store.events("r")

    a, b, history = asyncio.run(main())
    assert a == b == history[3:]
    assert [(e.from_state, e.to_state, e.reason) for e in history[3:]] == [
        (State.RUNNING_TOOLS, State.AWAITING_APPROVAL, "rule touches: a human"),
        (State.AWAITING_APPROVAL, State.RUNNING_TOOLS, "s1c1 started"),
        (State.RUNNING_TOOLS, State.REQUESTING_MODEL, "batch finished"),
    ]
    Machine.replay("r", history)


def test_a_retry_after_the_end_gets_the_end_recorded_then(tmp_path: Path) -> None:
    async def main() -> tuple[list[Transition], list[Transition], int]:
        store = RunStore(Journal(tmp_path / "j.db").runs)
        _, opening = await _opened(store)
        await store.open_step("r", opening, "bot")
        first = StepMoves(store, "r", _calls(2), seen=3)
        for i in range(2):
            await first.on_event(_event(EventKind.FINISHED, i, DONE))
        await first.end()
        await store.open_step("r", opening, "bot")  # the retry: recognised
        retry = StepMoves(store, "r", _calls(2), seen=3)
        for i in range(2):
            await retry.on_event(_event(EventKind.FINISHED, i, DONE))  # answered by replay
        await retry.end()
        return first.recorded, retry.recorded, len(await store.events("r"))

    first, retry, count = asyncio.run(main())
    assert first == retry
    assert [e.seq for e in retry] == [4]
    assert count == 4


def test_a_step_records_nothing_once_the_run_moved_on(tmp_path: Path) -> None:
    """Another writer of the run (the owner's other client) ended it meanwhile: the
    step's handler records no end of its own; its answer is what the run holds."""

    async def main() -> tuple[list[Transition], list[Transition]]:
        store = RunStore(Journal(tmp_path / "j.db").runs)
        m, opening = await _opened(store)
        await store.open_step("r", opening, "bot")
        step = StepMoves(store, "r", _calls(1), seen=3)
        stopped = [m.advance(State.CANCELLED, "stopped elsewhere")]
        await store.append("r", stopped, "bot")
        await step.on_event(_event(EventKind.FINISHED, 0, DONE))
        await step.end()
        return step.recorded, await store.events("r")

    recorded, history = asyncio.run(main())
    assert [(e.to_state, e.reason) for e in recorded] == [(State.CANCELLED, "stopped elsewhere")]
    assert len(history) == 4


class _GatedSync:
    """The real SQLite run records, with each `sync` held until `release` is set and
    every write noted in order (a spy: the writes themselves are the journal's)."""

    def __init__(self, journal: Journal) -> None:
        self._real = journal.runs
        self.release = asyncio.Event()
        self.writes: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def append(self, run_id: str, events: list[Any], *, durable: bool = True) -> Run:
        self.writes.append(f"append {events[-1].to_state.value} durable={durable}")
        return await self._real.append(run_id, events, durable=durable)

    async def sync(self, run_id: str) -> None:
        self.writes.append("sync")
        await self.release.wait()
        await self._real.sync(run_id)


def test_nothing_more_of_a_run_is_recorded_before_a_steps_end_is_on_disk(
    tmp_path: Path,
) -> None:
    """The step's end is committed (the step answers at once) and fsync'd after; the
    run's next write -- here the next step's opening -- waits for that fsync."""

    async def main() -> tuple[list[str], bool]:
        gated = _GatedSync(Journal(tmp_path / "j.db"))
        store = RunStore(gated)  # type: ignore[arg-type]
        m, opening = await _opened(store)
        await store.open_step("r", opening, "bot")
        step = StepMoves(store, "r", _calls(1), seen=3)
        await step.on_event(_event(EventKind.FINISHED, 0, DONE))
        [end] = await step.end()  # answered while its fsync is held
        m.record(end)
        nxt = [m.advance(State.VALIDATING, "model replied"), m.advance(State.RUNNING_TOOLS, "s")]
        opening2 = asyncio.create_task(store.open_step("r", nxt, "bot"))
        done, _ = await asyncio.wait({opening2}, timeout=scaled(0.3))
        waited = not done
        gated.release.set()
        await opening2
        return gated.writes, waited

    writes, waited = asyncio.run(main())
    assert waited, "the next opening should wait for the end's fsync"
    assert writes == [
        "append requesting_model durable=True",  # run started (AppendEvents)
        "append running_tools durable=False",  # the opening
        "append requesting_model durable=False",  # the end: committed...
        "sync",  # ...then fsync'd, before
        "append running_tools durable=False",  # the next opening
    ]


class _FailingSync(_GatedSync):
    """The first `sync` fails (a disk error, as the journal would raise it)."""

    async def sync(self, run_id: str) -> None:
        self.writes.append("sync")
        if self.writes.count("sync") == 1:
            raise sqlite3.OperationalError("disk I/O error")
        await self._real.sync(run_id)


def test_a_failed_fsync_fails_the_runs_next_write_once(tmp_path: Path) -> None:
    async def main() -> tuple[str, int]:
        failing = _FailingSync(Journal(tmp_path / "j.db"))
        store = RunStore(failing)  # type: ignore[arg-type]
        m, opening = await _opened(store)
        await store.open_step("r", opening, "bot")
        step = StepMoves(store, "r", _calls(1), seen=3)
        await step.on_event(_event(EventKind.FINISHED, 0, DONE))
        [end] = await step.end()
        m.record(end)
        nxt = [m.advance(State.VALIDATING, "model replied"), m.advance(State.RUNNING_TOOLS, "s")]
        with pytest.raises(sqlite3.OperationalError) as failed:
            await store.open_step("r", nxt, "bot")  # the end may not be on disk: refused
        again = await store.open_step("r", nxt, "bot")  # the journal works again
        return str(failed.value), again.last_seq

    error, last_seq = asyncio.run(main())
    assert error == "disk I/O error"
    assert last_seq == 6
