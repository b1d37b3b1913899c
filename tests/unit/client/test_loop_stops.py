"""Stop rules and the tally they read: thresholds, priority, and repeats."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execgate.client.loop.states import STOPS, State
from execgate.client.loop.stops import (
    Cancelled,
    Deadline,
    MaxConsecutiveErrors,
    MaxCost,
    MaxSteps,
    MaxTokens,
    NoProgress,
    Stop,
    StopRule,
    StopRules,
)
from execgate.client.loop.tally import Tally, canonical_arguments, fingerprint

T0 = 100.0  # the monotonic clock at the run's start

# The documented priority, written out here rather than read from stops.PRIORITY.
ORDER = [
    "cancelled",
    "deadline",
    "max_tokens",
    "max_cost",
    "max_steps",
    "max_consecutive_errors",
    "no_progress",
]


def _tally() -> Tally:
    return Tally(started_at=T0)


def _fail(t: Tally, n: int, tool: str = "read_file", result: str = "r") -> None:
    for i in range(n):
        t.record_result(tool, {"path": f"f{i}"}, False, result, summary="failure/not_found")


# ---------------------------------------------------------------- fingerprints


def test_fingerprint_is_short_stable_and_ignores_key_order() -> None:
    a = fingerprint({"b": 1, "a": [1, 2]})
    assert a == fingerprint({"a": [1, 2], "b": 1})
    assert len(a) == 16
    assert int(a, 16) >= 0
    assert a != fingerprint({"a": [2, 1], "b": 1})
    assert fingerprint("x") == fingerprint("x") != fingerprint("y")


def test_canonical_arguments_equal_for_dict_and_raw_json() -> None:
    assert canonical_arguments({"path": "x", "limit": 3}) == '{"limit":3,"path":"x"}'
    assert canonical_arguments('{ "path": "x",  "limit": 3 }') == '{"limit":3,"path":"x"}'
    assert canonical_arguments("{not json") == "{not json"


# ---------------------------------------------------------------- the tally


def test_record_model_adds_up() -> None:
    t = _tally()
    t.record_model(10, 5, 0.25)
    t.record_model(1, 2, 0.5)
    assert (t.steps, t.input_tokens, t.output_tokens, t.tokens, t.cost) == (2, 11, 7, 18, 0.75)
    assert t.last_action == "model request"
    with pytest.raises(ValueError, match="negative"):
        t.record_model(-1, 0, 0)
    assert t.steps == 2


def test_consecutive_errors_reset_on_success_failures_do_not() -> None:
    t = _tally()
    _fail(t, 3)
    assert (t.consecutive_errors, t.failures) == (3, 3)
    t.record_result("read_file", {"path": "ok"}, True, "r2")
    assert (t.consecutive_errors, t.failures) == (0, 3)
    _fail(t, 1)
    assert (t.consecutive_errors, t.failures) == (1, 4)
    assert t.last_action == 'tool read_file {"path":"f0"}'
    assert t.last_result == "failure/not_found"


def test_repeats_count_identical_calls_with_identical_results_only() -> None:
    t = _tally()
    t.record_result("read_file", {"path": "a", "limit": 5}, False, "nf")
    t.record_result("read_file", '{"limit": 5, "path": "a"}', False, "nf")
    t.record_result("read_file", {"path": "a", "limit": 5}, False, "other result")
    t.record_result("read_file", {"path": "b", "limit": 5}, False, "nf")
    t.record_result("list_dir", {"path": "a", "limit": 5}, False, "nf")
    assert sorted(t.repeats.values()) == [1, 1, 1, 2]
    assert t.max_repeat_evidence == {
        "tool": "read_file",
        "arguments": '{"limit":5,"path":"a"}',
        "result": "nf",
        "count": 2,
    }


def test_figures_have_the_documented_keys() -> None:
    t = _tally()
    t.record_model(3, 4, 0.1)
    assert t.figures(T0 + 2.5) == {
        "steps": 1,
        "input_tokens": 3,
        "output_tokens": 4,
        "tokens": 7,
        "cost": 0.1,
        "elapsed_s": 2.5,
        "failures": 0,
        "consecutive_errors": 0,
        "last_action": "model request",
        "last_result": "3 tokens in, 4 out",
    }


def test_the_first_cancel_request_stands() -> None:
    t = _tally()
    t.request_cancel("alice", "wrong task", 1.0)
    t.request_cancel("bob", "later", 2.0)
    assert t.cancel is not None
    assert (t.cancel.who, t.cancel.at) == ("alice", 1.0)


# ---------------------------------------------------------------- each rule at its threshold


def _steps(t: Tally, n: int) -> None:
    for _ in range(n):
        t.record_model(0, 0, 0.0)


def _tokens(t: Tally, n: int) -> None:
    t.record_model(n // 2, n - n // 2, 0.0)


def _cost(t: Tally, n: int) -> None:
    for _ in range(n):
        t.record_model(0, 0, 0.25)


def _repeat(t: Tally, n: int) -> None:
    for _ in range(n):
        t.record_result("search", {"pattern": "x"}, True, "same")


# (rule, how to push the tally to k, the k at which it must fire, state, evidence it shows)
BOUNDARIES: list[tuple[StopRule, Callable[[Tally, int], None], int, State, dict[str, Any]]] = [
    (MaxSteps(3), _steps, 3, State.EXPIRED, {"limit": 3, "steps": 3}),
    (MaxTokens(101), _tokens, 101, State.BUDGET_EXHAUSTED, {"limit": 101, "tokens": 101}),
    (MaxCost(1.0), _cost, 4, State.BUDGET_EXHAUSTED, {"limit": 1.0, "cost": 1.0}),
    (MaxConsecutiveErrors(3), _fail, 3, State.FAILED, {"limit": 3, "count": 3}),
    (NoProgress(3), _repeat, 4, State.ESCALATED, {"tool": "search", "count": 4, "limit": 3}),
]


@pytest.mark.parametrize(("rule", "push", "at", "state", "shown"), BOUNDARIES)
def test_each_rule_fires_at_its_threshold_not_before(
    rule: StopRule,
    push: Callable[[Tally, int], None],
    at: int,
    state: State,
    shown: dict[str, Any],
) -> None:
    before, exactly = _tally(), _tally()
    push(before, at - 1)
    push(exactly, at)
    assert rule.check(before, T0) is None
    stop = rule.check(exactly, T0)
    assert stop is not None
    assert (stop.rule, stop.state) == (rule.name, state)
    assert shown.items() <= stop.evidence.items()
    assert stop.figures == exactly.figures(T0)
    assert stop.reason


def test_consecutive_errors_evidence_names_the_last_result() -> None:
    t = _tally()
    _fail(t, 2)
    stop = MaxConsecutiveErrors(2).check(t, T0)
    assert stop is not None
    assert stop.evidence["last_result"] == "failure/not_found"
    assert "failure/not_found" in stop.reason


def test_no_progress_does_not_count_different_results() -> None:
    t = _tally()
    for i in range(10):
        t.record_result("search", {"pattern": "x"}, True, f"result {i}")
    assert NoProgress(3).check(t, T0) is None


def test_deadline_fires_at_the_deadline_not_before() -> None:
    t = _tally()
    assert Deadline(10).check(t, T0 + 9.999) is None
    stop = Deadline(10).check(t, T0 + 10)
    assert stop is not None
    assert (stop.rule, stop.state, stop.evidence) == (
        "deadline",
        State.EXPIRED,
        {"limit_s": 10, "elapsed_s": 10.0},
    )


def test_cancel_fires_with_who_and_why() -> None:
    t = _tally()
    assert Cancelled().check(t, T0) is None
    t.request_cancel("alice", "wrong repository", 1234.5)
    stop = Cancelled().check(t, T0)
    assert stop is not None
    assert stop.state is State.CANCELLED
    assert stop.evidence == {"who": "alice", "reason": "wrong repository", "requested_at": 1234.5}
    assert stop.reason == "cancelled by alice: wrong repository"


@pytest.mark.parametrize(
    "make",
    [
        lambda: MaxSteps(0),
        lambda: MaxTokens(-1),
        lambda: MaxCost(0.0),
        lambda: Deadline(0),
        lambda: MaxConsecutiveErrors(0),
        lambda: NoProgress(0),
    ],
)
def test_limits_must_be_positive(make: Callable[[], StopRule]) -> None:
    with pytest.raises(ValueError, match="positive"):
        make()


def test_a_stop_is_never_completed() -> None:
    with pytest.raises(ValueError, match="completed"):
        Stop("x", State.COMPLETED, "done", {}, {})


# ---------------------------------------------------------------- the composite


def _all_rules() -> list[StopRule]:
    return [
        Cancelled(),
        Deadline(5),
        MaxTokens(10),
        MaxCost(0.5),
        MaxSteps(2),
        MaxConsecutiveErrors(2),
        NoProgress(1),
    ]


def _everything_fires() -> Tally:
    t = _tally()
    t.record_model(10, 10, 1.0)
    t.record_model(0, 0, 0.0)
    _repeat(t, 1)
    for _ in range(2):
        t.record_result("search", {"pattern": "y"}, False, "e")
    t.request_cancel("alice", "stop", 1.0)
    return t


def test_priority_cancel_then_deadline_then_budget_steps_errors_no_progress() -> None:
    t, now = _everything_fires(), T0 + 60
    rules = _all_rules()
    assert all(rule.check(t, now) for rule in rules)
    decided = []
    while rules:
        random.Random(len(rules)).shuffle(rules)
        stop = StopRules(rules).first(t, now)
        assert stop is not None
        decided.append(stop.rule)
        rules = [r for r in rules if r.name != stop.rule]
    assert decided == ORDER


def test_no_rule_fires_on_a_fresh_run() -> None:
    assert StopRules(_all_rules()).first(_tally(), T0) is None


def test_one_rule_per_name() -> None:
    with pytest.raises(ValueError, match="one rule per name"):
        StopRules([MaxSteps(1), MaxSteps(2)])


def test_default_rules() -> None:
    rules = StopRules.default()
    assert [r.name for r in rules.rules] == [
        "cancelled",
        "max_steps",
        "max_consecutive_errors",
        "no_progress",
    ]
    t = _tally()
    _steps(t, 49)
    assert rules.first(t, T0 + 10**6) is None
    _steps(t, 1)
    stop = rules.first(t, T0)
    assert stop is not None
    assert stop.rule == "max_steps"
    full = StopRules.default(max_tokens=1, max_cost=1.0, deadline_s=1.0)
    assert [r.name for r in full.rules] == ORDER
    bare = StopRules.default(max_steps=None, max_consecutive_errors=None, max_repeats=None)
    assert [r.name for r in bare.rules] == ["cancelled"]


# ---------------------------------------------------------------- property


_calls = st.tuples(
    st.sampled_from(["read_file", "search"]),
    st.sampled_from([{"path": "a"}, {"path": "b"}, '{"path": "a"}']),
    st.booleans(),
    st.sampled_from(["r1", "r2"]),
)


@given(
    models=st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 50), st.sampled_from([0.0, 0.1, 0.5])),
        max_size=8,
    ),
    calls=st.lists(_calls, max_size=12),
    cancel=st.booleans(),
    elapsed=st.floats(0, 30, allow_nan=False),
    limits=st.tuples(
        st.integers(1, 30),
        st.integers(1, 200),
        st.sampled_from([0.2, 1.0, 2.0]),
        st.integers(1, 20),
        st.integers(1, 5),
        st.integers(1, 4),
    ),
    seed=st.integers(0, 1000),
)
def test_first_is_the_highest_priority_firing_rule(
    models: list[tuple[int, int, float]],
    calls: list[tuple[str, dict[str, Any] | str, bool, str]],
    cancel: bool,
    elapsed: float,
    limits: tuple[int, int, float, float, int, int],
    seed: int,
) -> None:
    t = _tally()
    for usage_in, usage_out, cost in models:
        t.record_model(usage_in, usage_out, cost)
    for call in calls:
        t.record_result(*call)
    if cancel:
        t.request_cancel("someone", "because", 0.0)
    steps, tokens, cost_limit, deadline, errors, repeats = limits
    rules: list[StopRule] = [
        Cancelled(),
        Deadline(deadline),
        MaxTokens(tokens),
        MaxCost(cost_limit),
        MaxSteps(steps),
        MaxConsecutiveErrors(errors),
        NoProgress(repeats),
    ]
    random.Random(seed).shuffle(rules)
    now = T0 + elapsed

    # An oracle computed from the raw record, independent of the rules' own code.
    worst = max(_oracle_repeats(calls).values(), default=0)
    fires = {
        "cancelled": cancel,
        "deadline": elapsed >= deadline,
        "max_tokens": sum(a + b for a, b, _ in models) >= tokens,
        "max_cost": sum(c for _, _, c in models) >= cost_limit,
        "max_steps": len(models) >= steps,
        "max_consecutive_errors": _trailing_failures(calls) >= errors,
        "no_progress": worst > repeats,
    }
    stop = StopRules(rules).first(t, now)
    firing = [name for name in ORDER if fires[name]]
    if not firing:
        assert stop is None
        return
    assert stop is not None
    assert stop.rule == firing[0]
    assert stop.state in STOPS
    assert stop.state is not State.COMPLETED
    for rule in rules:
        single = rule.check(t, now)
        assert (single is not None) == fires[rule.name]
        assert single is None or single.state is not State.COMPLETED
    assert t.repeats.get(t.max_repeat_key, 0) == worst


def _oracle_repeats(calls: list[tuple[str, dict[str, Any] | str, bool, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for tool, args, _, result in calls:
        parsed = json.loads(args) if isinstance(args, str) else args
        key = json.dumps([tool, parsed, result], sort_keys=True)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _trailing_failures(calls: list[tuple[str, dict[str, Any] | str, bool, str]]) -> int:
    n = 0
    for _, _, ok, _ in reversed(calls):
        if ok:
            break
        n += 1
    return n
