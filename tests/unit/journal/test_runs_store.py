"""RunRecordStore on SQLite: runs, their events, cancel requests, claims, startup maps."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from execgate.executor.core.approval import Approval, ApprovalState
from execgate.executor.core.outcomes import Outcome, Status
from execgate.executor.core.run import CancelAsk, Run
from execgate.executor.core.runstate import State, Transition
from execgate.executor.journal.records import CallRecord, RunClaim, RunConflict
from execgate.executor.journal.store import Journal

from .conftest import open_at, rows


def _run(
    run_id: str, owner: str = "bot", *, created_at: float = 1.0, state: str = "created"
) -> Run:
    return Run(
        run_id=run_id,
        goal="fix the bug",
        owner=owner,
        limits={"max_steps": 3},
        labels={"team": "a"},
        created_at=created_at,
        updated_at=created_at,
        state=state,
    )


def _call(run_id: str, call_id: str, agent: str) -> CallRecord:
    return CallRecord(
        run_id=run_id,
        call_id=call_id,
        batch_id="b",
        tool="noop",
        arguments_json="{}",
        request_hash="h",
        idempotency_key="",
        agent=agent,
        may_write=False,
        created_at=1.0,
    )


def _moves(run_id: str) -> list[Transition]:
    return [
        Transition(run_id, 1, 2.0, State.CREATED, State.REQUESTING_MODEL, "go", {"n": 1}),
        Transition(run_id, 2, 3.0, State.REQUESTING_MODEL, State.COMPLETED, "done", {}),
    ]


def test_a_run_is_inserted_once_and_reads_back(journal: Journal) -> None:
    async def go() -> tuple[RunConflict | None, RunConflict | None, Run | None, Run | None]:
        first = await journal.runs.insert(_run("r1"))
        again = await journal.runs.insert(_run("r1", owner="bot"))
        return first, again, await journal.runs.get("r1"), await journal.runs.get("nope")

    first, again, got, missing = asyncio.run(go())
    assert first is None
    assert again == RunConflict(exists=True)
    assert got == _run("r1")
    assert missing is None


def test_a_run_id_others_have_calls_or_parked_calls_under_is_not_theirs_to_start(
    journal: Journal, path: Path
) -> None:
    parked = Approval(
        id="a1", run_id="r2", call_id="c", batch_id="b", tool="t", arguments_json="{}",
        requester="zed", rule_id="x", reason="", approvers=("olga",), created_at=1.0,
        expires_at=2.0, state=ApprovalState.PENDING,
    )  # fmt: skip

    async def go() -> list[RunConflict | None]:
        await journal.record_finished(_call("r1", "c1", "eve"), Outcome(status=Status.SUCCESS))
        await journal.record_finished(_call("r1", "c2", "bot"), Outcome(status=Status.SUCCESS))
        await journal.approvals.insert(parked, None)
        await journal.record_finished(_call("r3", "c1", "bot"), Outcome(status=Status.SUCCESS))
        return [
            await journal.runs.insert(_run("r1")),
            await journal.runs.insert(_run("r2")),
            await journal.runs.insert(_run("r3")),  # only the owner's own calls: fine
        ]

    assert asyncio.run(go()) == [RunConflict(others=("eve",)), RunConflict(others=("zed",)), None]
    assert rows(path, "SELECT run_id FROM runs") == [("r3",)]


def test_appended_events_move_the_run_and_read_back_in_order(journal: Journal) -> None:
    async def go() -> tuple[Run, list[Transition], list[Transition], Run | None]:
        await journal.runs.insert(_run("r1"))
        moved = await journal.runs.append("r1", _moves("r1"))
        return (
            moved,
            await journal.runs.events("r1"),
            await journal.runs.events("r1", after_seq=1),
            await journal.runs.get("r1"),
        )

    moved, events, after_one, got = asyncio.run(go())
    assert (moved.state, moved.reason, moved.last_seq) == ("completed", "done", 2)
    assert got == moved
    assert events == _moves("r1")
    assert after_one == _moves("r1")[1:]


def test_an_append_that_fails_leaves_neither_events_nor_the_row_changed(journal: Journal) -> None:
    async def go() -> tuple[BaseException | None, list[Transition], Run | None]:
        await journal.runs.insert(_run("r1"))
        await journal.runs.append("r1", _moves("r1")[:1])
        error = None
        try:  # seq 1 again (the registry never sends it; the table refuses it)
            await journal.runs.append("r1", [_moves("r1")[1], _moves("r1")[0]])
        except Exception as exc:
            error = exc
        return error, await journal.runs.events("r1"), await journal.runs.get("r1")

    error, events, got = asyncio.run(go())
    assert error is not None
    assert events == _moves("r1")[:1]
    assert got is not None
    assert (got.state, got.last_seq) == ("requesting_model", 1)


def test_the_first_cancel_request_stands(journal: Journal) -> None:
    first, second = CancelAsk("olga", "stop", 5.0), CancelAsk("ann", "later", 6.0)

    async def go() -> tuple[Run, Run]:
        await journal.runs.insert(_run("r1"))
        return (
            await journal.runs.request_cancel("r1", first),
            await journal.runs.request_cancel("r1", second),
        )

    one, two = asyncio.run(go())
    assert one.cancel == first
    assert two.cancel == first


def test_find_filters_by_state_owner_and_owner_globs_newest_first(journal: Journal) -> None:
    async def go() -> list[list[str]]:
        await journal.runs.insert(_run("a", "bot", created_at=1.0))
        await journal.runs.insert(_run("b", "bot-2", created_at=2.0))
        await journal.runs.insert(_run("c", "eve", created_at=3.0))
        await journal.runs.append("a", _moves("a"))
        found = [
            await journal.runs.find([], "", 10),
            await journal.runs.find(["created"], "", 10),
            await journal.runs.find([], "bot", 10),
            await journal.runs.find([], "", 10, owners=("bot*",)),
            await journal.runs.find([], "", 10, owners=()),
            await journal.runs.find([], "", 1),
        ]
        return [[r.run_id for r in runs] for runs in found]

    assert asyncio.run(go()) == [["c", "b", "a"], ["c", "b"], ["a"], ["b", "a"], [], ["c"]]


def test_a_claim_names_the_owner_and_everyone_with_calls(journal: Journal) -> None:
    async def go() -> list[RunClaim]:
        await journal.runs.insert(_run("r1", "bot"))
        await journal.record_finished(_call("r1", "c1", "bot"), Outcome(status=Status.SUCCESS))
        await journal.record_finished(_call("r2", "c1", "eve"), Outcome(status=Status.SUCCESS))
        return [
            await journal.runs.claim("r1"),
            await journal.runs.claim("r2"),
            await journal.runs.claim("r3"),
        ]

    assert asyncio.run(go()) == [
        RunClaim("bot", frozenset({"bot"})),
        RunClaim(None, frozenset({"eve"})),
        RunClaim(None, frozenset()),
    ]


def test_the_startup_maps_of_ended_runs_and_owners(path: Path) -> None:
    async def write() -> None:
        j = open_at(path)
        try:
            await j.runs.insert(replace(_run("open", "bot"), workspace="shared"))
            await j.runs.insert(_run("done", "eve"))
            await j.runs.append("done", _moves("done"))
        finally:
            j.close()

    asyncio.run(write())
    j = open_at(path)
    try:
        assert j.runs.ended() == {"done": "completed"}
        assert j.runs.owners() == {"open": "bot", "done": "eve"}
        assert j.runs.workspaces() == {"open": "shared", "done": "default"}
    finally:
        j.close()


def test_an_append_told_not_durable_is_committed_and_sync_writes_the_row(
    journal: Journal, path: Path
) -> None:
    """`durable=False` commits like any append (a reader sees it at once); `sync` is a
    real write of the run's row -- `updated_at` moves on even when it already lies ahead
    of the clock, since SQLite writes (and fsyncs) nothing for an unchanged row."""
    far = 4e9  # year 2096: ahead of any clock this test runs under

    def updated_at() -> float:
        return float(rows(path, "SELECT updated_at FROM runs WHERE run_id = 'r1'")[0][0])

    async def go() -> tuple[list[Transition], float]:
        await journal.runs.insert(_run("r1", created_at=far))
        await journal.runs.sync("r1")
        synced = updated_at()
        await journal.runs.append("r1", _moves("r1")[:1], durable=False)
        return await journal.runs.events("r1"), synced

    seen, synced = asyncio.run(go())
    assert synced > far
    assert [e.seq for e in seen] == [1]
