"""CallStore on SQLite: intents, outcomes, finished rows, refusals, reads and recovery."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from execgate.executor.core.outcomes import ErrorClass, Outcome, Status
from execgate.executor.journal.records import (
    CallFilter,
    CallRecord,
    DuplicateCall,
    KeyTaken,
    PolicyRecord,
)
from execgate.executor.journal.store import Journal

from .conftest import open_at, rows


def _rec(
    call_id: str, *, run_id: str = "r", agent: str = "bot", key: str = "", **kw: object
) -> CallRecord:
    fields: dict[str, object] = {
        "run_id": run_id,
        "call_id": call_id,
        "batch_id": "b",
        "tool": "write_file",
        "arguments_json": '{"path": "a"}',
        "request_hash": "h-" + call_id,
        "idempotency_key": key,
        "agent": agent,
        "may_write": True,
        "created_at": 100.0,
    }
    fields.update(kw)
    return CallRecord(**fields)  # type: ignore[arg-type]


DONE = Outcome(status=Status.SUCCESS, message="ok")


def test_an_intent_then_its_outcome_is_one_finished_record_with_its_raw_result(
    journal: Journal,
) -> None:
    decision = PolicyRecord("allow", ("r1",), "rev", ("s:deny",))

    async def go() -> tuple[CallRecord | None, CallRecord | None, CallRecord | None]:
        await journal.record_intent(_rec("c1", decision=decision))
        running = await journal.get("r", "c1")
        await journal.record_outcome("r", "c1", DONE, "raw bytes", durable=True)
        return running, await journal.get("r", "c1"), await journal.get("r", "c1", include_raw=True)

    running, done, with_raw = asyncio.run(go())
    assert running is not None
    assert running.outcome is None
    assert done is not None
    assert done.outcome == DONE
    assert done.raw_result == ""
    assert done.decision == decision
    assert with_raw is not None
    assert with_raw.raw_result == "raw bytes"


def test_a_call_id_is_taken_once_per_run(journal: Journal) -> None:
    async def go() -> None:
        await journal.record_intent(_rec("c1"))
        await journal.record_intent(_rec("c1", run_id="other"))  # another run: its own id
        with pytest.raises(DuplicateCall):
            await journal.record_intent(_rec("c1"))
        with pytest.raises(DuplicateCall):
            await journal.record_finished(_rec("c1"), DONE)

    asyncio.run(go())


def test_an_outcome_without_its_own_running_intent_is_refused(journal: Journal) -> None:
    async def go() -> None:
        with pytest.raises(DuplicateCall):  # no intent at all
            await journal.record_outcome("r", "nobody", DONE, "", durable=False)
        await journal.record_finished(_rec("c1"), DONE)
        with pytest.raises(DuplicateCall):  # finished already: never overwritten
            await journal.record_outcome("r", "c1", DONE, "", durable=True)

    asyncio.run(go())


def test_a_nowait_intent_lands_before_a_later_write_and_a_taken_id_is_only_logged(
    journal: Journal, path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> CallRecord | None:
        await journal.record_finished(_rec("taken"), DONE)
        journal.record_intent_nowait(_rec("c1", may_write=False))
        with caplog.at_level(logging.DEBUG, logger="execgate.journal"):
            journal.record_intent_nowait(_rec("taken", may_write=False))
            await journal.record_outcome("r", "c1", DONE, "", durable=False)
        return await journal.get("r", "c1")

    got = asyncio.run(go())
    assert got is not None
    assert got.outcome == DONE
    assert not got.may_write
    # The refused insert was an expected answer (DEBUG), not an error.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert rows(path, "SELECT count(*) FROM calls WHERE call_id='taken'") == [(1,)]


def test_a_refusal_is_recorded_apart_and_leaves_the_call_that_owns_the_id_alone(
    journal: Journal, path: Path
) -> None:
    refused = Outcome(
        status=Status.REJECTED, error_class=ErrorClass.INVALID_ARGUMENT, message="dup"
    )

    async def go() -> CallRecord | None:
        await journal.record_finished(_rec("c1"), DONE)
        await journal.record_refusal(_rec("c1", tool="other"), refused)
        return await journal.get("r", "c1")

    original = asyncio.run(go())
    assert original is not None
    assert original.outcome == DONE
    assert original.tool == "write_file"
    assert rows(path, "SELECT run_id, call_id, tool, error_class, message FROM refusals") == [
        ("r", "c1", "other", "invalid_argument", "dup")
    ]


def test_a_call_is_found_by_its_agents_idempotency_key_only(journal: Journal) -> None:
    async def go() -> tuple[CallRecord | None, CallRecord | None]:
        await journal.record_finished(_rec("c1", key="K"), DONE)
        # One key, one call, per agent (the dispatcher's idempotency claim keeps a
        # second one from getting here in one daemon; across daemons the store refuses).
        with pytest.raises(KeyTaken):
            await journal.record_finished(_rec("c2", key="K"), DONE)
        await journal.record_finished(_rec("c3", key="K", agent="eve"), DONE)  # ... each
        return await journal.by_idempotency_key("bot", "K"), await journal.by_idempotency_key(
            "bot", "L"
        )

    found, missing = asyncio.run(go())
    assert found is not None
    assert found.call_id == "c1"
    assert found.idempotency_key == "K"
    assert missing is None


def test_list_is_newest_first_filtered_and_pages_with_its_cursor(journal: Journal) -> None:
    failed = Outcome(status=Status.FAILURE, error_class=ErrorClass.NOT_FOUND)

    async def go() -> list[list[str]]:
        for i in range(5):
            await journal.record_finished(_rec(f"c{i}", created_at=100.0 + i), DONE)
        await journal.record_finished(_rec("f", created_at=200.0), failed)
        await journal.record_finished(_rec("x", run_id="r2", agent="eve"), DONE)
        pages: list[list[str]] = []
        cursor = 0
        while True:
            page, cursor = await journal.list(
                CallFilter(run_id="r", statuses=(Status.SUCCESS,), limit=2, before_seq=cursor)
            )
            pages.append([c.call_id for c in page])
            if not cursor:
                break
        only_eve, _ = await journal.list(CallFilter(agents=("e*",)))
        nobody, _ = await journal.list(CallFilter(agents=()))
        late, _ = await journal.list(CallFilter(since=150.0))
        pages += [[c.call_id for c in only_eve], [c.call_id for c in nobody]]
        pages.append([c.call_id for c in late])
        return pages

    assert asyncio.run(go()) == [["c4", "c3"], ["c2", "c1"], ["c0"], ["x"], [], ["f"]]


def test_a_calls_workspace_is_recorded_and_listed_by(journal: Journal) -> None:
    async def go() -> tuple[list[str], list[str], CallRecord | None]:
        await journal.record_finished(_rec("home", workspace="home"), DONE)
        await journal.record_intent(_rec("shared", workspace="shared"))
        await journal.record_finished(_rec("old"), DONE)  # a record that names none: default
        home, _ = await journal.list(CallFilter(workspace="home"))
        every, _ = await journal.list(CallFilter())
        return (
            [c.call_id for c in home],
            [c.workspace for c in every],
            await journal.get("r", "shared"),
        )

    home, every, shared = asyncio.run(go())
    assert home == ["home"]
    assert every == ["default", "shared", "home"]
    assert shared is not None
    assert shared.workspace == "shared"


def test_recovery_settles_running_calls_by_whether_they_may_write(path: Path) -> None:
    async def write() -> None:
        j = open_at(path)
        try:
            await j.record_intent(_rec("w", may_write=True))
            await j.record_intent(_rec("ro", may_write=False))
            await j.record_finished(_rec("done"), DONE)
        finally:
            j.close()

    asyncio.run(write())
    j = open_at(path)  # the next daemon
    try:
        assert j.recover() == 2
        assert j.recover() == 0
        w, ro, done = asyncio.run(_gets(j, "w", "ro", "done"))
    finally:
        j.close()
    assert w is not None
    assert w.outcome is not None
    assert (w.outcome.status, w.outcome.error_class) == (
        Status.UNKNOWN_OUTCOME,
        ErrorClass.INTERRUPTED,
    )
    assert ro is not None
    assert ro.outcome is not None
    assert (ro.outcome.status, ro.outcome.error_class) == (Status.FAILURE, ErrorClass.INTERRUPTED)
    assert done is not None
    assert done.outcome == DONE


async def _gets(j: Journal, *call_ids: str) -> list[CallRecord | None]:
    return [await j.get("r", c) for c in call_ids]


def test_a_begun_intent_is_waited_for_from_a_thread_and_awaited(journal: Journal) -> None:
    seen: list[CallRecord | None] = []

    async def go() -> None:
        intent = journal.begin_intent(_rec("c1"))
        # A tool's worker thread waits for it; the writer wakes it, not the event loop.
        await asyncio.to_thread(intent.wait)
        seen.append(await journal.get("r", "c1"))
        await intent.done()
        taken = journal.begin_intent(_rec("c1"))
        with pytest.raises(DuplicateCall):
            await asyncio.to_thread(taken.wait)
        with pytest.raises(DuplicateCall):
            await taken.done()

    asyncio.run(go())
    assert seen[0] is not None
    assert seen[0].outcome is None  # a running row
