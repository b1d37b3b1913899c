"""ApprovalStore on SQLite: pending rows, one winning transition, reads, restart."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from execgate.executor.core.approval import Approval, ApprovalState
from execgate.executor.journal.records import PolicyRecord
from execgate.executor.journal.store import Journal

from .conftest import open_at, rows


def _approval(
    id: str, *, run_id: str = "r", call_id: str = "c", created_at: float = 10.0
) -> Approval:
    return Approval(
        id=id,
        run_id=run_id,
        call_id=call_id,
        batch_id="b",
        tool="run_command",
        arguments_json='{"argv": ["true"]}',
        requester="bot",
        rule_id="ask-commands",
        reason="commands need a human",
        approvers=("approver", "olga"),
        created_at=created_at,
        expires_at=created_at + 60,
        state=ApprovalState.PENDING,
        idempotency_key="K",
        timeout=5.0,
        workspace="shared",
    )


def test_an_inserted_approval_reads_back_whole_with_its_decision(
    journal: Journal, path: Path
) -> None:
    a = _approval("a1")

    async def go() -> Approval | None:
        await journal.approvals.insert(a, PolicyRecord("ask", ("ask-commands",), "rev"))
        return await journal.approvals.get("a1")

    assert asyncio.run(go()) == a
    (decision,) = rows(path, "SELECT decision_json FROM approvals WHERE id='a1'")[0]
    assert PolicyRecord.from_json(decision) == PolicyRecord("ask", ("ask-commands",), "rev")


def test_only_the_first_transition_of_a_pending_approval_wins(journal: Journal) -> None:
    async def go() -> tuple[Approval | None, Approval | None, Approval | None]:
        await journal.approvals.insert(_approval("a1"), None)
        won = await journal.approvals.transition("a1", ApprovalState.APPROVED, "olga", "fine")
        lost = await journal.approvals.transition("a1", ApprovalState.EXPIRED, "", "ttl")
        return won, lost, await journal.approvals.get("a1")

    won, lost, now = asyncio.run(go())
    assert won is not None
    assert (won.state, won.decided_by, won.comment) == (ApprovalState.APPROVED, "olga", "fine")
    assert won.decided_at is not None
    assert lost is None
    assert now == won


def test_racing_transitions_have_exactly_one_winner(journal: Journal) -> None:
    async def go() -> list[Approval | None]:
        await journal.approvals.insert(_approval("a1"), None)
        return await asyncio.gather(
            journal.approvals.transition("a1", ApprovalState.APPROVED, "olga", ""),
            journal.approvals.transition("a1", ApprovalState.DENIED, "ann", ""),
            journal.approvals.transition("a1", ApprovalState.EXPIRED, "", "ttl"),
        )

    results = asyncio.run(go())
    assert sum(r is not None for r in results) == 1


def test_reads_by_call_run_and_pending_oldest_first(journal: Journal) -> None:
    async def go() -> tuple[
        list[str], list[str], Approval | None, Approval | None, Approval | None
    ]:
        await journal.approvals.insert(_approval("late", call_id="c2", created_at=30.0), None)
        await journal.approvals.insert(_approval("early", call_id="c1", created_at=20.0), None)
        await journal.approvals.insert(_approval("other", run_id="r2", created_at=10.0), None)
        await journal.approvals.transition("late", ApprovalState.DENIED, "olga", "no")
        pending = [a.id for a in await journal.approvals.pending()]
        of_run = [a.id for a in await journal.approvals.of_run("r")]
        return (
            pending,
            of_run,
            await journal.approvals.parked("r", "c1"),
            await journal.approvals.parked("r", "c2"),  # decided: no longer parked
            await journal.approvals.get("nope"),
        )

    pending, of_run, parked, decided, missing = asyncio.run(go())
    assert pending == ["other", "early"]
    assert of_run == ["early", "late"]
    assert parked is not None
    assert parked.id == "early"
    assert decided is None
    assert missing is None


def test_pending_approvals_outlive_the_daemon(path: Path) -> None:
    async def write() -> None:
        j = open_at(path)
        try:
            await j.approvals.insert(_approval("b", created_at=2.0), None)
            await j.approvals.insert(_approval("a", created_at=1.0), None)
            await j.approvals.insert(_approval("gone", created_at=0.5), None)
            await j.approvals.transition("gone", ApprovalState.EXPIRED, "", "ttl")
        finally:
            j.close()

    asyncio.run(write())
    j = open_at(path)
    try:
        left = j.approvals.left_pending()
    finally:
        j.close()
    assert [a.id for a in left] == ["a", "b"]
    assert left[0] == replace(_approval("a", created_at=1.0))
