"""The moves the daemon records for a loop step (executor/runs/steps.py): the same
records the client loop appends when it closes a batch itself (on resume), decided from
the state the run is in now."""

from __future__ import annotations

from execgate.client.loop import record as client_record
from execgate.executor.core.runstate import State, Transition
from execgate.executor.runs import steps

RESULTS = [steps.Result("s1c1", "success", "none"), steps.Result("s1c2", "failure", "timeout")]


def _edges(moves: list[Transition]) -> list[tuple[State, State, str, int]]:
    return [(m.from_state, m.to_state, m.reason, m.seq) for m in moves]


def test_the_reasons_are_the_client_loops() -> None:
    assert steps.BATCH_FINISHED == client_record.BATCH_FINISHED
    assert steps.APPROVALS_SETTLED == client_record.APPROVALS_SETTLED


def test_a_batch_ends_back_at_the_model_with_its_results_in_proposal_order() -> None:
    [end] = steps.closed("r", State.RUNNING_TOOLS, 7, RESULTS)
    assert _edges([end]) == [(State.RUNNING_TOOLS, State.REQUESTING_MODEL, "batch finished", 7)]
    assert end.data == {
        "results": [
            {"call_id": "s1c1", "status": "success", "error_class": "none"},
            {"call_id": "s1c2", "status": "failure", "error_class": "timeout"},
        ]
    }


def test_a_batch_that_ends_while_the_run_waits_settles_first() -> None:
    moves = steps.closed("r", State.AWAITING_APPROVAL, 7, RESULTS)
    assert _edges(moves) == [
        (State.AWAITING_APPROVAL, State.RUNNING_TOOLS, "approvals settled", 7),
        (State.RUNNING_TOOLS, State.REQUESTING_MODEL, "batch finished", 8),
    ]
    assert moves[0].data == {}


def test_an_ended_step_is_not_ended_again() -> None:
    for state in (State.REQUESTING_MODEL, State.CANCELLED, State.WAITING):
        assert steps.closed("r", state, 9, RESULTS) == []


def test_parking_moves_the_run_once_and_only_from_running_tools() -> None:
    [parked] = steps.parked("r", State.RUNNING_TOOLS, 4, "s1c1", "ap1", "touches", "needs a human")
    assert _edges([parked]) == [
        (State.RUNNING_TOOLS, State.AWAITING_APPROVAL, "rule touches: needs a human", 4)
    ]
    assert parked.data == {"call_id": "s1c1", "approval_id": "ap1"}
    # A second call parked while the run already waits, or a retried step: no move.
    assert steps.parked("r", State.AWAITING_APPROVAL, 5, "s1c2", "ap2", "t", "x") == []


def test_the_last_parked_call_going_on_moves_the_run_back() -> None:
    [back] = steps.unparked("r", State.AWAITING_APPROVAL, 5, "s1c1", "started")
    assert _edges([back]) == [(State.AWAITING_APPROVAL, State.RUNNING_TOOLS, "s1c1 started", 5)]
    assert back.data == {}
    assert steps.unparked("r", State.RUNNING_TOOLS, 5, "s1c1", "finished") == []
