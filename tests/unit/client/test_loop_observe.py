"""What the model sees of a call: hints for every error class, bounded text, rendering."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execgate.client import Outcome, Status
from execgate.client.loop.observe import (
    DAEMON_HINTS,
    REFUSAL_HINTS,
    Refusal,
    bound,
    hint_for,
    not_run,
    observe,
)
from execgate.executor.core.outcomes import ErrorClass
from execgate.v1 import executor_pb2 as pb

# The source of truth is the proto (the contract the client speaks); names as `wire` makes them.
PROTO_CLASSES = {
    name.removeprefix("ERROR_CLASS_").lower()
    for name in pb.ErrorClass.keys()  # noqa: SIM118 (a protobuf enum wrapper, not a dict)
    if name != "ERROR_CLASS_UNSPECIFIED"
}
ERROR_CLASSES = sorted(PROTO_CLASSES - {"none"})
UNKNOWN_HINT = (
    "the effect is unknown: reconcile (check the state) before repeating; do not repeat blindly"
)


def test_hints_cover_exactly_the_classes_the_daemon_emits() -> None:
    assert set(DAEMON_HINTS) == PROTO_CLASSES
    # The daemon's own enum is the same set: nothing it can emit is missing from the proto.
    assert {c.value for c in ErrorClass} == PROTO_CLASSES
    assert len(ERROR_CLASSES) == 20


@pytest.mark.parametrize("error_class", ERROR_CLASSES)
@pytest.mark.parametrize("status", ["failure", "rejected"])
def test_every_error_class_has_a_hint(status: str, error_class: str) -> None:
    hint = hint_for(status, error_class)
    assert hint == DAEMON_HINTS[error_class]
    assert len(hint) > 20


@pytest.mark.parametrize(
    ("error_class", "hint"),
    [
        ("invalid_argument", "fix the arguments and call again"),
        ("not_found", "check the name/path; it does not exist"),
    ],
)
def test_the_plain_hints(error_class: str, hint: str) -> None:
    assert hint_for("rejected", error_class) == hint


@pytest.mark.parametrize("error_class", ["permission_denied", "policy_denied", "approval_denied"])
def test_denials_say_do_not_retry(error_class: str) -> None:
    assert hint_for("rejected", error_class).startswith("do not retry")


@pytest.mark.parametrize("error_class", ["timeout", "cancelled", "interrupted", "internal"])
def test_an_unknown_outcome_says_reconcile_whatever_the_class(error_class: str) -> None:
    assert hint_for("unknown_outcome", error_class) == UNKNOWN_HINT


def test_success_needs_no_hint_partial_says_continue() -> None:
    assert hint_for("success", "none") == ""
    assert "continue" in hint_for("partial", "none")


@pytest.mark.parametrize("error_class", ["unspecified", "something_newer"])
def test_a_class_this_client_does_not_know_falls_back_on_the_status(error_class: str) -> None:
    assert hint_for("rejected", error_class).startswith("the call did not run")
    assert hint_for("failure", error_class).startswith("the call failed")


@pytest.mark.parametrize("refusal", list(Refusal))
def test_loop_refusals_have_hints_and_are_rejected_errors(refusal: Refusal) -> None:
    obs = not_run("c1", "write_file", "the run hit its step cap", refusal)
    assert (obs.status, obs.error_class, obs.is_error) == ("rejected", refusal.value, True)
    assert obs.hint == REFUSAL_HINTS[refusal] != ""
    assert obs.text == "the run hit its step cap"
    assert set(REFUSAL_HINTS) == set(Refusal)


def test_not_run_accepts_a_daemon_class() -> None:
    obs = not_run("c1", "read_file", "arguments are not JSON", "invalid_argument")
    assert obs.hint == "fix the arguments and call again"


# ---------------------------------------------------------------- bounding


def test_short_text_is_untouched() -> None:
    assert bound("x" * 4000) == "x" * 4000


def test_long_text_keeps_head_and_tail_and_says_how_much_was_cut() -> None:
    text = "H" * 3000 + "M" * 4000 + "T" * 3000
    cut = bound(text)
    assert len(cut) <= 4000
    marker = re.search(r"\n\[\.\.\. (\d+) chars cut \.\.\.\]\n", cut)
    assert marker is not None
    kept = len(cut) - len(marker.group(0))
    assert int(marker.group(1)) == len(text) - kept
    assert cut.startswith("H" * 1000)
    assert cut.endswith("T" * 1000)


@given(text=st.text(min_size=0, max_size=3000), cap=st.integers(64, 2000))
def test_bound_never_exceeds_the_cap_and_counts_the_cut(text: str, cap: int) -> None:
    cut = bound(text, cap)
    assert len(cut) <= cap
    if len(text) <= cap:
        assert cut == text
        return
    marker = re.findall(r"\n\[\.\.\. (\d+) chars cut \.\.\.\]\n", cut)
    assert marker
    count = int(marker[-1])
    kept = len(cut) - len(f"\n[... {count} chars cut ...]\n")
    assert count == len(text) - kept
    head = (kept + 1) // 2
    assert cut[:head] == text[:head]
    assert cut[len(cut) - (kept - head) :] == text[len(text) - (kept - head) :]


def test_a_tiny_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="cap"):
        bound("x" * 100, 10)


# ---------------------------------------------------------------- observe and render


def test_a_success_is_its_text() -> None:
    outcome = Outcome(call_id="c1", status=Status.SUCCESS, error_class="none", text="hello")
    obs = observe(outcome, "read_file")
    assert (obs.call_id, obs.tool, obs.status, obs.is_error, obs.hint) == (
        "c1",
        "read_file",
        "success",
        False,
        "",
    )
    assert obs.render() == "[success]\nhello"


def test_a_failure_shows_class_hint_field_and_message() -> None:
    outcome = Outcome(
        call_id="c2",
        status=Status.FAILURE,
        error_class="not_found",
        message="notes.txt does not exist",
        field="arguments.path",
    )
    obs = observe(outcome, "read_file")
    assert obs.is_error
    assert obs.text == "arguments.path: notes.txt does not exist"
    assert obs.render() == (
        "[failure: not_found] check the name/path; it does not exist\n"
        "arguments.path: notes.txt does not exist"
    )


def test_a_nonzero_exit_keeps_message_and_output() -> None:
    outcome = Outcome(
        call_id="c3",
        status=Status.FAILURE,
        error_class="nonzero_exit",
        message="exit status 1",
        text="FAILED test_x",
    )
    assert observe(outcome, "run_command").text == "exit status 1\nFAILED test_x"


def test_a_partial_result_is_not_an_error_and_says_how_much_came_back() -> None:
    outcome = Outcome(
        call_id="c4",
        status=Status.PARTIAL,
        error_class="none",
        message="result truncated at the output cap",
        text="line 1",
        truncated=True,
        returned_bytes=10,
        total_bytes=20,
    )
    obs = observe(outcome, "read_file")
    assert not obs.is_error
    assert obs.text.endswith("[returned 10 of 20 bytes]")
    assert obs.hint.startswith("the result was cut")


def test_an_unknown_outcome_is_an_error_with_the_reconcile_hint() -> None:
    outcome = Outcome(call_id="c5", status=Status.UNKNOWN_OUTCOME, error_class="timeout")
    obs = observe(outcome, "write_file")
    assert obs.is_error
    assert obs.hint == UNKNOWN_HINT
    assert obs.render() == f"[unknown_outcome: timeout] {UNKNOWN_HINT}\n(no output)"


def test_structured_stands_in_for_missing_text() -> None:
    outcome = Outcome(
        call_id="c6", status=Status.SUCCESS, error_class="none", structured={"rows": [[1]]}
    )
    assert observe(outcome, "sql").text == '{"rows": [[1]]}'


def test_a_replayed_answer_says_so() -> None:
    outcome = Outcome(
        call_id="c7", status=Status.SUCCESS, error_class="none", text="ok", replay_of="c1"
    )
    assert observe(outcome, "write_file").text == "ok\n[the result of an earlier call, c1]"


def test_observe_bounds_the_text_at_the_default_cap() -> None:
    outcome = Outcome(call_id="c8", status=Status.SUCCESS, error_class="none", text="y" * 10_000)
    obs = observe(outcome, "read_file")
    assert len(obs.text) <= 4000
    assert "chars cut" in obs.text
    assert len(observe(outcome, "read_file", cap=500).text) <= 500
