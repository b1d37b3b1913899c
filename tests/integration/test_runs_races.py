"""The run store and the approvals gate under interleavings a daemon meets: a cancel
racing an append, a watcher reading history while the run ends, an approval decided
before the re-parked call waits for it. Real journal (SQLite) in a temporary dir."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from execgate.client.loop.states import Machine, State
from execgate.executor.core.run import CancelAsk, Run
from execgate.executor.journal.store import Journal
from execgate.executor.pipeline.approve import Approval, Approvals, ApprovalState
from execgate.executor.policy.identity import Identity, Role
from execgate.executor.runs.registry import Refusal, RunRefused, RunStore
from execgate.executor.sandbox.ladder import CancelScope


def test_a_cancel_racing_the_final_append_never_leaves_a_completed_run_with_a_cancel(
    tmp_path: Path,
) -> None:
    async def one(store: RunStore, i: int) -> tuple[str, bool]:
        run = await store.start(Run(run_id=f"r{i}", goal="g", owner="bot"))
        m = Machine(run.run_id)
        moves = [m.advance(State.REQUESTING_MODEL, "go"), m.advance(State.VALIDATING, "answer")]
        await store.append(run.run_id, moves, "bot")
        done = m.advance(State.COMPLETED, "accepted")
        ask = CancelAsk("olga", "stop", time.time())
        results = await asyncio.gather(
            store.append(run.run_id, [done], "bot"),
            store.request_cancel(run.run_id, ask),
            return_exceptions=True,
        )
        refused = isinstance(results[0], RunRefused)
        if refused:
            assert results[0].kind is Refusal.CANCEL_REQUESTED  # type: ignore[union-attr]
        final = await store.get(run.run_id)
        return final.state, final.cancel is not None

    async def main() -> list[tuple[str, bool]]:
        store = RunStore(Journal(tmp_path / "j.db").runs)
        return [await one(store, i) for i in range(30)]

    for state, cancelled in asyncio.run(main()):
        # Either the run completed first (and the late cancel was not recorded on it), or
        # the cancel came first and completing was refused.
        assert (state, cancelled) in (("completed", False), ("validating", True))


def test_a_watcher_sees_the_terminal_event_even_when_the_run_ends_mid_history(
    tmp_path: Path,
) -> None:
    async def main() -> list[str]:
        store = RunStore(Journal(tmp_path / "j.db").runs)
        run = await store.start(Run(run_id="", goal="g", owner="bot"))
        m = Machine(run.run_id)
        await store.append(run.run_id, [m.advance(State.REQUESTING_MODEL, "go")], "bot")
        seen: list[str] = []

        async def watch() -> None:
            async for update in store.watch(run.run_id, 0):
                seen.append(update.event.to_state.value if update.event else "cancel")
                await asyncio.sleep(0.1)  # a slow consumer (a gRPC send)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.02)  # the watcher is sending the stored history
        await store.append(run.run_id, [m.advance(State.FAILED, "model_error")], "bot")
        await asyncio.wait_for(watcher, 5)
        return seen

    assert asyncio.run(main()) == ["requesting_model", "failed"]


@pytest.mark.parametrize("run_id", ["default", "x" * 300])
def test_the_shared_run_and_overlong_ids_cannot_be_started(tmp_path: Path, run_id: str) -> None:
    async def main() -> RunRefused:
        store = RunStore(Journal(tmp_path / "j.db").runs)
        with pytest.raises(RunRefused) as refused:
            await store.start(Run(run_id=run_id, goal="g", owner="bob"))
        return refused.value

    refused = asyncio.run(main())
    assert refused.field == "run_id"
    assert refused.kind in (Refusal.FORBIDDEN, Refusal.MALFORMED)


def test_an_approval_decided_before_the_reparked_call_waits_is_not_waited_for_forever(
    tmp_path: Path,
) -> None:
    async def main() -> ApprovalState:
        journal = Journal(tmp_path / "j.db")
        approvals = Approvals(journal.approvals)
        now = time.time()
        left = Approval(
            id="appr_x", run_id="r", call_id="c", batch_id="b", tool="run_command",
            arguments_json="{}", requester="bot", rule_id="touch", reason="asks",
            approvers=("approver",), created_at=now, expires_at=now + 0.5,
            state=ApprovalState.PENDING,
        )  # fmt: skip
        await journal.approvals.insert(left, None)
        # The restarted daemon read `left` as pending; a Decide lands before the
        # re-parked call reaches its wait.
        alice = Identity(name="alice", roles=frozenset({Role.APPROVER}))
        await approvals.decide("appr_x", approve=True, comment="ok", decider=alice)
        approvals._waiting[left.id] = asyncio.get_running_loop().create_future()
        ended = await asyncio.wait_for(approvals.wait(left, CancelScope()), 5)
        return ended.state

    assert asyncio.run(main()) is ApprovalState.APPROVED


def test_on_ended_hears_each_run_that_ends_once(tmp_path: Path) -> None:
    """The hook the daemon's wiring sets (an MCP server's `pool: run` processes close):
    told once, when the terminal event is stored; not for live moves or refused ones."""

    async def main() -> list[str]:
        store = RunStore(Journal(tmp_path / "j.db").runs)
        heard: list[str] = []
        store.on_ended = heard.append
        run = await store.start(Run(run_id="r", goal="g", owner="bot"))
        m = Machine(run.run_id)
        await store.append(run.run_id, [m.advance(State.REQUESTING_MODEL, "go")], "bot")
        assert heard == []
        late = Machine(run.run_id)  # a second writer that missed the end
        late.advance(State.REQUESTING_MODEL, "go")
        await store.append(run.run_id, [m.advance(State.CANCELLED, "stop")], "bot")
        with pytest.raises(RunRefused):
            await store.append(run.run_id, [late.advance(State.FAILED, "again")], "bot")
        return heard

    assert asyncio.run(main()) == ["r"]
