"""Units of the loop's turn handling: the stop-reason table, the path each turn takes,
the retry policy (backoff, jitter, Retry-After, the bounds) and a completion's caveats."""

from __future__ import annotations

import pytest

from execgate.client.loop.backing import Path, caveats, path_of
from execgate.client.loop.record import Planned
from execgate.client.loop.retry import Retry, ask, retryable
from execgate.client.loop.states import State
from execgate.client.loop.stops import Stop
from execgate.client.models.base import Ending, ToolCall, Turn, Usage, ending_of
from execgate.client.models.errors import (
    ModelBadResponse,
    ModelError,
    ModelRateLimited,
    ModelRequestRejected,
    ModelUnavailable,
)
from execgate.client.types import Outcome, Status

CALL = ToolCall("c1", "read_file", {"path": "a"})


@pytest.mark.parametrize(
    ("said", "ending"),
    [
        ("stop", Ending.END),
        ("end_turn", Ending.END),
        ("stop_sequence", Ending.END),
        ("", Ending.END),
        ("tool_calls", Ending.TOOL_USE),
        ("tool_use", Ending.TOOL_USE),
        ("pause_turn", Ending.PAUSED),
        ("length", Ending.TRUNCATED),
        ("max_tokens", Ending.TRUNCATED),
        ("MAX_TOKENS", Ending.TRUNCATED),
        ("refusal", Ending.REFUSED),
        ("content_filter", Ending.REFUSED),
        ("recitation", Ending.UNKNOWN),
    ],
)
def test_stop_reasons_map_to_endings(said: str, ending: Ending) -> None:
    assert ending_of(said) is ending


@pytest.mark.parametrize(
    ("said", "calls", "path"),
    [
        ("stop", (), Path.ANSWER),
        ("stop", (CALL,), Path.CALLS),  # servers that say "stop" with calls
        ("tool_calls", (CALL,), Path.CALLS),
        ("tool_calls", (), Path.FAIL),  # calls announced, none readable
        ("pause_turn", (), Path.CONTINUE),
        ("length", (), Path.FAIL),
        ("length", (CALL,), Path.FAIL),  # cut-off arguments never run
        ("refusal", (), Path.FAIL),
        ("whatever", (), Path.FAIL),
    ],
)
def test_each_ending_has_one_path(said: str, calls: tuple[ToolCall, ...], path: Path) -> None:
    turn = Turn("t", calls, Usage(), said)
    assert path_of(turn) is path
    assert turn.final is (path is Path.ANSWER)


def test_backoff_doubles_to_its_cap_with_jitter_below() -> None:
    top = Retry(base_s=1.0, max_s=5.0, random=lambda: 0.0)
    low = Retry(base_s=1.0, max_s=5.0, jitter=0.5, random=lambda: 1.0)
    err = ModelUnavailable("m", "down")
    assert [top.backoff(n, err) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    assert [low.backoff(n, err) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 2.5]


def test_retry_after_is_a_floor() -> None:
    policy = Retry(base_s=1.0, random=lambda: 0.0)
    assert policy.backoff(1, ModelRateLimited("m", 7.5)) == 7.5
    assert policy.backoff(1, ModelRateLimited("m", 0.1)) == 1.0
    assert policy.backoff(1, ModelRateLimited("m", None)) == 1.0


@pytest.mark.parametrize(
    ("error", "again"),
    [
        (ModelRateLimited("m", None), True),
        (ModelUnavailable("m", "HTTP 503", status=503), True),
        (ModelUnavailable("m", "refused"), True),
        (ModelRequestRejected("m", 400, "bad"), False),
        (ModelRequestRejected("m", 401, "key"), False),
        (ModelRequestRejected("m", 404, "model"), False),
        (ModelBadResponse("m", "not json"), False),
    ],
)
def test_which_errors_are_retried(error: ModelError, again: bool) -> None:
    assert retryable(error) is again


def _failing(errors: list[ModelError], turn: Turn | None = None) -> tuple[list[int], object]:
    seen: list[int] = []

    def request() -> Turn:
        seen.append(1)
        if errors:
            raise errors.pop(0)
        assert turn is not None
        return turn

    return seen, request


def test_ask_retries_until_an_answer_and_sleeps_each_backoff() -> None:
    slept: list[float] = []
    turn = Turn("ok", (), Usage(), "stop")
    seen, request = _failing([ModelRateLimited("m", 2.0), ModelUnavailable("m", "x")], turn)
    policy = Retry(base_s=1.0, random=lambda: 0.0, sleep=slept.append)
    asked = ask(request, policy, check_stop=lambda: None, deadline=None)  # type: ignore[arg-type]
    assert asked.turn is turn
    assert slept == [2.0, 2.0]
    assert [a.retry for a in asked.retries] == [1, 2]
    assert len(seen) == 3


def test_ask_gives_up_after_its_attempts() -> None:
    errors: list[ModelError] = [ModelUnavailable("m", "x") for _ in range(5)]
    seen, request = _failing(errors)
    asked = ask(request, Retry(attempts=2, base_s=0), check_stop=lambda: None, deadline=None)  # type: ignore[arg-type]
    assert isinstance(asked.error, ModelUnavailable)
    assert len(seen) == 3
    assert len(asked.retries) == 2


def test_ask_stops_when_a_stop_rule_fires_between_retries() -> None:
    stop = Stop("cancelled", State.CANCELLED, "asked to", {}, {})
    seen, request = _failing([ModelUnavailable("m", "x")] * 3)
    asked = ask(request, Retry(base_s=0), check_stop=lambda: stop, deadline=None)  # type: ignore[arg-type]
    assert asked.stopped is stop
    assert len(seen) == 1


def test_a_non_retryable_error_is_not_retried() -> None:
    seen, request = _failing([ModelRequestRejected("m", 401, "key")])
    asked = ask(request, Retry(base_s=0), check_stop=lambda: None, deadline=None)  # type: ignore[arg-type]
    assert isinstance(asked.error, ModelRequestRejected)
    assert asked.retries == []
    assert len(seen) == 1


def _done(tool: str, args: dict[str, str], status: Status, n: int) -> tuple[Planned, Outcome]:
    return Planned(f"s{n}c1", 0, f"m{n}", tool, args), Outcome(
        call_id=f"s{n}c1", status=status, error_class="none"
    )


def test_caveats_name_failed_and_unknown_calls_not_later_redone() -> None:
    done = [
        _done("read_file", {"path": "a"}, Status.FAILURE, 1),
        _done("read_file", {"path": "a"}, Status.SUCCESS, 2),  # redone: no caveat
        _done("read_file", {"path": "b"}, Status.FAILURE, 3),
        _done("write_file", {"path": "c"}, Status.UNKNOWN_OUTCOME, 4),
    ]
    assert caveats(done) == [
        "answer followed 1 failed call(s): s3c1 read_file failure",
        "1 call(s) with an unknown outcome left unreconciled: s4c1 write_file unknown_outcome",
    ]
    assert caveats(done[:2]) == []
