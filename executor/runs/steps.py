"""The transitions the daemon records for a loop step (Runs.Step): the batch's end, and
the moves while calls of the batch wait for an approval.

They are the records the client loop appends for itself when it runs a batch without
Step (client/loop/step.py `_batch_done` and `_on_event`, and the TypeScript loop's):
the same edges, reasons and data, so a run's history reads the same whichever path
wrote it (tests/unit/runs/test_steps.py holds the texts equal). Each function decides
from the state the run is in now and returns the moves to append (none when the run
is already there: a retried step, or a second call parked while the run waits):

    running_tools -> awaiting_approval   "rule R: REASON"   {"call_id", "approval_id"}
    awaiting_approval -> running_tools   "CALL started" / "CALL finished" (the last
                                         parked call went on), or "approvals settled"
                                         (at the batch's end)
    running_tools -> requesting_model    "batch finished"   {"results": [{call_id,
                                         status, error_class}, ...]} in proposal order
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from execgate.executor.core import clock
from execgate.executor.core.runstate import State, Transition

# The states a run is in while a step's batch runs; any other ends the step.
IN_BATCH = frozenset({State.RUNNING_TOOLS, State.AWAITING_APPROVAL})

BATCH_FINISHED = "batch finished"
APPROVALS_SETTLED = "approvals settled"


@dataclass(frozen=True, slots=True)
class Result:
    """One call's line in the batch's end: what the loop's model is told it got."""

    call_id: str
    status: str
    error_class: str

    def to_json(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "status": self.status, "error_class": self.error_class}


def parked(
    run_id: str, state: State, seq: int, call_id: str, approval_id: str, rule: str, why: str
) -> list[Transition]:
    """A call of the batch awaits an approval: the run waits with it."""
    if state is not State.RUNNING_TOOLS:
        return []
    data = {"call_id": call_id, "approval_id": approval_id}
    return [_move(run_id, seq, state, State.AWAITING_APPROVAL, f"rule {rule}: {why}", data)]


def unparked(run_id: str, state: State, seq: int, call_id: str, how: str) -> list[Transition]:
    """The last parked call of the batch went on (`how`: "started" or "finished")."""
    if state is not State.AWAITING_APPROVAL:
        return []
    return [_move(run_id, seq, state, State.RUNNING_TOOLS, f"{call_id} {how}", {})]


def closed(run_id: str, state: State, seq: int, results: Sequence[Result]) -> list[Transition]:
    """Every call of the batch has its outcome: back to the model."""
    moves = []
    if state is State.AWAITING_APPROVAL:
        moves.append(_move(run_id, seq, state, State.RUNNING_TOOLS, APPROVALS_SETTLED, {}))
        state, seq = State.RUNNING_TOOLS, seq + 1
    if state is State.RUNNING_TOOLS:
        data = {"results": [r.to_json() for r in results]}
        moves.append(_move(run_id, seq, state, State.REQUESTING_MODEL, BATCH_FINISHED, data))
    return moves


def _move(
    run_id: str, seq: int, src: State, dst: State, reason: str, data: dict[str, Any]
) -> Transition:
    return Transition(run_id, seq, clock.now(), src, dst, reason, data)
