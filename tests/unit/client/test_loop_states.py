"""The run's state machine: the table, the Machine, the persisted record and replay."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import execgate.client.loop
from execgate.client.errors import ExecgateClientError
from execgate.client.loop.errors import Breakage, BrokenHistory, IllegalTransition, LoopError
from execgate.client.loop.states import (
    RESUME_INTO,
    STOPS,
    TERMINAL,
    TRANSITIONS,
    Machine,
    State,
    Transition,
    check_transition,
)

S = State
_STOP_NAMES = {"failed", "cancelled", "budget_exhausted", "expired", "escalated"}

# The table written out by hand, independently of how states.py builds it.
EXPECTED_EDGES: dict[str, set[str]] = {
    "created": {"requesting_model", "waiting"} | _STOP_NAMES,
    "requesting_model": {"validating", "waiting"} | _STOP_NAMES,
    "validating": {"running_tools", "awaiting_approval", "requesting_model", "completed"}
    | {"waiting"}
    | _STOP_NAMES,
    "awaiting_approval": {"running_tools", "requesting_model", "waiting"} | _STOP_NAMES,
    "running_tools": {"requesting_model", "awaiting_approval", "waiting"} | _STOP_NAMES,
    "waiting": {"requesting_model", "validating", "awaiting_approval", "running_tools"}
    | _STOP_NAMES,
    "completed": set(),
    **{name: set() for name in _STOP_NAMES},
}
ALL_PAIRS = list(itertools.product(State, State))
LEGAL = [(a, b) for a, b in ALL_PAIRS if b.value in EXPECTED_EDGES[a.value]]
ILLEGAL = [(a, b) for a, b in ALL_PAIRS if b.value not in EXPECTED_EDGES[a.value]]


def test_the_table_is_the_documented_one() -> None:
    assert {s.value for s in State} == set(EXPECTED_EDGES)
    assert {a.value: {b.value for b in bs} for a, bs in TRANSITIONS.items()} == EXPECTED_EDGES
    assert {s.value for s in TERMINAL} == _STOP_NAMES | {"completed"}
    assert len(LEGAL) == 49
    assert len(LEGAL) + len(ILLEGAL) == len(State) ** 2


@pytest.mark.parametrize(("from_state", "to_state"), LEGAL)
def test_every_legal_pair_passes(from_state: State, to_state: State) -> None:
    check_transition(from_state, to_state)


@pytest.mark.parametrize(("from_state", "to_state"), ILLEGAL)
def test_every_illegal_pair_raises(from_state: State, to_state: State) -> None:
    with pytest.raises(IllegalTransition) as info:
        check_transition(from_state, to_state)
    assert info.value.from_state is from_state
    assert info.value.to_state is to_state
    assert f"{from_state.value} -> {to_state.value}" in str(info.value)


def test_terminals_are_final_and_only_validation_completes() -> None:
    for terminal in TERMINAL:
        assert TRANSITIONS[terminal] == frozenset()
    assert [s for s in State if S.COMPLETED in TRANSITIONS[s]] == [S.VALIDATING]
    for state in set(State) - TERMINAL:
        assert TRANSITIONS[state] >= STOPS, state
        assert state not in TRANSITIONS[state], "no self-loops"


def test_every_state_is_reachable_and_every_live_state_can_end() -> None:
    seen, frontier = {S.CREATED}, [S.CREATED]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()] - seen:
            seen.add(nxt)
            frontier.append(nxt)
    assert seen == set(State)
    assert all(TRANSITIONS[s] & TERMINAL for s in set(State) - TERMINAL)


def test_exceptions_hang_from_the_client_root() -> None:
    assert issubclass(IllegalTransition, LoopError)
    assert issubclass(BrokenHistory, LoopError)
    assert issubclass(LoopError, ExecgateClientError)


# ---------------------------------------------------------------- Machine


def test_advance_records_the_move_and_counts_seq() -> None:
    m = Machine("r1", clock=lambda: 1000.0)
    first = m.advance(S.REQUESTING_MODEL, "start", {"model": "m"})
    second = m.advance(S.VALIDATING, "reply", at=1001.5)
    assert first == Transition(
        "r1", 1, 1000.0, S.CREATED, S.REQUESTING_MODEL, "start", {"model": "m"}
    )
    assert (second.seq, second.at, second.from_state) == (2, 1001.5, S.REQUESTING_MODEL)
    assert (m.state, m.next_seq) == (S.VALIDATING, 3)


def test_an_illegal_advance_changes_nothing() -> None:
    m = Machine("r1")
    m.advance(S.REQUESTING_MODEL, "start")
    with pytest.raises(IllegalTransition):
        m.advance(S.RUNNING_TOOLS, "skip validation")
    with pytest.raises(IllegalTransition):
        m.advance(S.COMPLETED, "the model said done")
    assert (m.state, m.next_seq) == (S.REQUESTING_MODEL, 2)


def test_the_record_keeps_its_own_copy_of_data() -> None:
    data: dict[str, Any] = {"calls": ["c1"]}
    moved = Machine("r1").advance(S.REQUESTING_MODEL, "start", data)
    data["calls"] = ["c2"]
    assert moved.data == {"calls": ["c1"]}


@pytest.mark.parametrize("left", sorted(RESUME_INTO))
def test_a_suspended_run_resumes_only_where_it_left(left: State) -> None:
    resume = RESUME_INTO[left]
    for target in set(RESUME_INTO.values()) - {resume}:
        m = _machine_in(left)
        m.advance(S.WAITING, "wait for a reply")
        assert m.suspended_from is left
        with pytest.raises(IllegalTransition, match=f"resumes into {resume.value}"):
            m.advance(target, "resume elsewhere")
        assert m.state is S.WAITING
    m = _machine_in(left)
    m.advance(S.WAITING, "wait")
    m.advance(resume, "resumed")
    assert (m.state, m.suspended_from) == (resume, None)


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_suspended_run_can_be_stopped(stop: State) -> None:
    m = _machine_in(S.RUNNING_TOOLS)
    m.advance(S.WAITING, "wait")
    m.advance(stop, "deadline or cancel while suspended")
    assert m.state is stop


_PATH_TO = {
    S.CREATED: [],
    S.REQUESTING_MODEL: [S.REQUESTING_MODEL],
    S.VALIDATING: [S.REQUESTING_MODEL, S.VALIDATING],
    S.AWAITING_APPROVAL: [S.REQUESTING_MODEL, S.VALIDATING, S.AWAITING_APPROVAL],
    S.RUNNING_TOOLS: [S.REQUESTING_MODEL, S.VALIDATING, S.RUNNING_TOOLS],
}


def _machine_in(state: State) -> Machine:
    m = Machine("r1", clock=lambda: 5.0)
    for step in _PATH_TO[state]:
        m.advance(step, "setup")
    assert m.state is state
    return m


# ---------------------------------------------------------------- the record


def test_json_has_the_stable_keys() -> None:
    moved = Transition("r1", 3, 12.5, S.VALIDATING, S.RUNNING_TOOLS, "2 calls passed", {"n": 2})
    assert moved.to_json() == {
        "run_id": "r1",
        "seq": 3,
        "time": 12.5,
        "from": "validating",
        "to": "running_tools",
        "reason": "2 calls passed",
        "data": {"n": 2},
    }


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(
    seq=st.integers(min_value=1, max_value=10**9),
    at=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    pair=st.sampled_from(LEGAL),
    reason=st.text(max_size=20),
    data=st.dictionaries(st.text(max_size=5), _json_values, max_size=4),
)
def test_json_round_trip(
    seq: int, at: float, pair: tuple[State, State], reason: str, data: dict[str, Any]
) -> None:
    moved = Transition("run", seq, at, pair[0], pair[1], reason, data)
    assert Transition.from_json(json.loads(json.dumps(moved.to_json()))) == moved


def _good() -> dict[str, Any]:
    return Transition("r1", 1, 1.0, S.CREATED, S.REQUESTING_MODEL, "start").to_json()


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d.pop("time"),
        lambda d: d.update(extra=1),
        lambda d: d.update(seq=True),
        lambda d: d.update(seq="1"),
        lambda d: d.update(time="now"),
        lambda d: d.update(to="done"),
        lambda d: d.update(data=[]),
        lambda d: d.update(run_id=7),
    ],
)
def test_malformed_records_are_broken_history(damage: Any) -> None:
    record = _good()
    damage(record)
    with pytest.raises(BrokenHistory) as info:
        Transition.from_json(record)
    assert info.value.kind is Breakage.MALFORMED


# ---------------------------------------------------------------- replay


def _history() -> list[Transition]:
    """A complete run (with a suspension), as a store would hand it back: through JSON."""
    m = Machine("r1", clock=lambda: 7.0)
    moves = [
        S.REQUESTING_MODEL,
        S.VALIDATING,
        S.AWAITING_APPROVAL,
        S.WAITING,
        S.AWAITING_APPROVAL,
        S.RUNNING_TOOLS,
        S.REQUESTING_MODEL,
        S.VALIDATING,
        S.COMPLETED,
    ]
    recorded = [m.advance(to, "step").to_json() for to in moves]
    return [Transition.from_json(json.loads(json.dumps(r))) for r in recorded]


def test_replay_rebuilds_the_run() -> None:
    history = _history()
    m = Machine.replay("r1", history)
    assert (m.state, m.next_seq) == (S.COMPLETED, 10)
    assert Machine.replay("r1", []).state is S.CREATED


def test_replay_rebuilds_a_suspension() -> None:
    history = _history()[:4]
    m = Machine.replay("r1", history)
    assert (m.state, m.suspended_from) == (S.WAITING, S.AWAITING_APPROVAL)
    with pytest.raises(IllegalTransition):
        m.advance(S.RUNNING_TOOLS, "resume past the approval")


def _replace(t: Transition, **changes: Any) -> Transition:
    return Transition(**{**t.__dict__, **changes})


@pytest.mark.parametrize(
    ("edit", "kind", "seq"),
    [
        (lambda h: h[:3] + h[4:], Breakage.GAP, 5),
        (lambda h: h[:4] + h[3:], Breakage.DUPLICATE, 4),
        (lambda h: [h[1], h[0], *h[2:]], Breakage.GAP, 2),
        (lambda h: [*h[:2], _replace(h[2], run_id="r2"), *h[3:]], Breakage.FOREIGN, 3),
        (lambda h: [*h[:2], _replace(h[2], from_state=S.RUNNING_TOOLS)], Breakage.DISCONTINUOUS, 3),
        (lambda h: [h[0], _replace(h[1], to_state=S.COMPLETED)], Breakage.ILLEGAL, 2),
    ],
)
def test_replay_refuses_broken_histories(edit: Any, kind: Breakage, seq: int) -> None:
    with pytest.raises(BrokenHistory) as info:
        Machine.replay("r1", edit(_history()))
    assert (info.value.kind, info.value.seq, info.value.run_id) == (kind, seq, "r1")


def test_replay_refuses_a_resume_that_skips_a_step() -> None:
    history = [
        Transition("r1", 1, 0.0, S.CREATED, S.REQUESTING_MODEL, "start"),
        Transition("r1", 2, 0.0, S.REQUESTING_MODEL, S.WAITING, "wait"),
        Transition("r1", 3, 0.0, S.WAITING, S.RUNNING_TOOLS, "resume"),
    ]
    with pytest.raises(BrokenHistory) as info:
        Machine.replay("r1", history)
    assert info.value.kind is Breakage.ILLEGAL
    assert isinstance(info.value.__cause__, IllegalTransition)


@given(choices=st.lists(st.integers(min_value=0, max_value=99), min_size=1, max_size=40))
def test_any_legal_walk_replays_and_any_dropped_record_is_a_gap(choices: list[int]) -> None:
    m = Machine("w", clock=lambda: 0.0)
    history: list[Transition] = []
    for choice in choices:
        options = sorted(TRANSITIONS[m.state])
        if m.state is S.WAITING:
            assert m.suspended_from is not None
            options = sorted(STOPS | {RESUME_INTO[m.suspended_from]})
        if not options:
            break
        history.append(m.advance(options[choice % len(options)], "walk"))
    replayed = Machine.replay("w", history)
    assert (replayed.state, replayed.next_seq) == (m.state, m.next_seq)
    for i in range(len(history) - 1):
        with pytest.raises(BrokenHistory) as info:
            Machine.replay("w", history[:i] + history[i + 1 :])
        assert info.value.kind is Breakage.GAP


def test_public_names_are_frozen() -> None:
    assert sorted(execgate.client.loop.__all__) == sorted(
        [
            "TERMINAL", "TRANSITIONS", "Breakage", "BrokenHistory", "CancelRequest", "Cancelled",
            "Deadline", "IllegalTransition", "LoopError", "Machine", "MaxConsecutiveErrors",
            "MaxCost", "MaxSteps", "MaxTokens", "NoProgress", "Observation", "Refusal", "State",
            "Stop", "StopRule", "StopRules", "Tally", "Transition", "canonical_arguments",
            "check_transition", "fingerprint", "hint_for", "not_run", "observe",
        ]
    )  # fmt: skip
    namespace: dict[str, Any] = {}
    exec("from execgate.client.loop import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(execgate.client.loop.__all__)
