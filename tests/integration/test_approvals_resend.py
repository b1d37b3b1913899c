"""A call an `ask` rule decided, re-sent with its call id and idempotency key (a resumed
agent loop does this): it never opens a second approval and never runs twice.

Finished already: answered from the journal (its outcome, `replay_of` itself), as an
allowed call is. Still parked: the new stream joins it -- it gets the same
AWAITING_APPROVAL, then the call's one outcome once decided. Real daemon, real journal.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from execgate.client import Call, EventKind, Outcome, Status
from tests.daemon import Daemon
from tests.integration.test_approvals import TOKENS, as_, calls_with_id, park, start
from tests.support import Streamer, wait_until

RUN = "resend"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start(tmp_path_factory.mktemp("resend"))
    yield d
    if d.proc is not None and d.proc.poll() is None:
        d.stop()


def keyed(call_id: str, name: str) -> Call:
    return Call(
        tool="run_command",
        arguments={"argv": ["touch", name]},
        call_id=call_id,
        idempotency_key=f"{RUN}:{call_id}",
    )


def approvals_of(daemon: Daemon, call_id: str) -> list[str]:
    with as_(daemon, "bot") as bot:
        return [a.approval_id for a in bot.approvals_of_run(RUN) if a.call_id == call_id]


def same(a: Outcome, b: Outcome) -> bool:
    """The same recorded outcome (a replay names the call it replays)."""
    return replace(a, replay_of="") == replace(b, replay_of="")


def resend(daemon: Daemon, call: Call) -> Streamer:
    stream = Streamer(daemon.address, [call], token=TOKENS["bot"], run_id=RUN)
    stream.join()
    assert stream.error is None, stream.error
    return stream


def test_a_finished_approved_call_resent_is_answered_from_the_journal(daemon: Daemon) -> None:
    call = keyed("fin-1", "fin-1.txt")
    first, approval_id = park(daemon, call, run_id=RUN)
    with as_(daemon, "alice") as alice:
        alice.approve(approval_id)
    first.join()
    assert first.outcome("fin-1").status is Status.SUCCESS

    again = resend(daemon, call)
    assert not again.seen(EventKind.AWAITING_APPROVAL, "fin-1"), again.events
    [finished] = [e for e in again.events if e.kind is EventKind.FINISHED]
    assert finished.outcome is not None
    assert same(finished.outcome, first.outcome("fin-1"))
    assert finished.outcome.replay_of == "fin-1"
    assert approvals_of(daemon, "fin-1") == [approval_id]
    assert calls_with_id(daemon, "fin-1") == 1


def test_a_denied_call_resent_gets_its_denial_not_a_new_approval(daemon: Daemon) -> None:
    call = keyed("den-1", "den-1.txt")
    first, approval_id = park(daemon, call, run_id=RUN)
    with as_(daemon, "alice") as alice:
        alice.deny(approval_id, "no")
    first.join()

    again = resend(daemon, call)
    assert not again.seen(EventKind.AWAITING_APPROVAL, "den-1"), again.events
    outcome = again.outcome("den-1")
    assert (outcome.status, outcome.error_class) == (Status.REJECTED, "approval_denied")
    assert same(outcome, first.outcome("den-1"))
    assert approvals_of(daemon, "den-1") == [approval_id]
    assert not (daemon.workspace / "den-1.txt").exists()


def test_a_finished_ask_call_resent_without_a_key_is_a_duplicate_id(daemon: Daemon) -> None:
    call = Call(tool="run_command", arguments={"argv": ["touch", "nokey.txt"]}, call_id="nk-1")
    first, approval_id = park(daemon, call, run_id=RUN)
    with as_(daemon, "alice") as alice:
        alice.approve(approval_id)
    first.join()

    again = resend(daemon, call)
    assert not again.seen(EventKind.AWAITING_APPROVAL, "nk-1"), again.events
    assert again.outcome("nk-1").error_class == "duplicate_call_id"
    assert approvals_of(daemon, "nk-1") == [approval_id]


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
def test_a_parked_call_resent_joins_its_approval(daemon: Daemon, approve: bool) -> None:
    call_id = f"park-{'ok' if approve else 'no'}"
    call = keyed(call_id, f"{call_id}.txt")
    first, approval_id = park(daemon, call, run_id=RUN)
    second = Streamer(daemon.address, [call], token=TOKENS["bot"], run_id=RUN)
    wait_until(
        lambda: second.seen(EventKind.AWAITING_APPROVAL, call_id) or second.error,
        "the re-sent call awaiting approval",
    )
    assert second.error is None, second.error
    [awaiting] = [e for e in second.events if e.kind is EventKind.AWAITING_APPROVAL]
    assert awaiting.approval_id == approval_id
    assert approvals_of(daemon, call_id) == [approval_id]

    with as_(daemon, "alice") as alice:
        if approve:
            alice.approve(approval_id)
        else:
            alice.deny(approval_id, "not now")
    first.join()
    second.join()
    assert second.error is None, second.error
    mine, theirs = first.outcome(call_id), second.outcome(call_id)
    assert same(mine, theirs)
    expected = Status.SUCCESS if approve else Status.REJECTED
    assert mine.status is expected, mine
    assert (daemon.workspace / f"{call_id}.txt").exists() is approve
    assert approvals_of(daemon, call_id) == [approval_id]
    assert calls_with_id(daemon, call_id) == 1
    # Once decided and finished, a third send is answered from the journal.
    third = resend(daemon, call)
    assert not third.seen(EventKind.AWAITING_APPROVAL, call_id)
    assert same(third.outcome(call_id), mine)


def test_a_parked_call_resent_with_other_arguments_is_refused(daemon: Daemon) -> None:
    call = keyed("park-diff", "a.txt")
    first, approval_id = park(daemon, call, run_id=RUN)
    other = Call(
        tool="run_command",
        arguments={"argv": ["touch", "b.txt"]},
        call_id="park-diff",
        idempotency_key=call.idempotency_key,
    )
    again = resend(daemon, other)
    assert not again.seen(EventKind.AWAITING_APPROVAL, "park-diff")
    assert again.outcome("park-diff").error_class == "duplicate_call_id"
    with as_(daemon, "alice") as alice:
        alice.deny(approval_id, "other arguments")
    first.join()
    assert approvals_of(daemon, "park-diff") == [approval_id]


def test_resent_outcomes_are_the_journal_s(daemon: Daemon) -> None:
    """The re-sent call adds no row: GetCall still returns the original record."""
    call = keyed("rec-1", "rec-1.txt")
    first, approval_id = park(daemon, call, run_id=RUN)
    with as_(daemon, "alice") as alice:
        alice.approve(approval_id)
    first.join()
    resend(daemon, call)
    with as_(daemon, "bot") as bot:
        record = bot.get_call("rec-1", run_id=RUN)
    assert record.outcome is not None
    assert same(record.outcome, first.outcome("rec-1"))
    assert calls_with_id(daemon, "rec-1") == 1


def test_another_agent_resending_a_parked_call_does_not_join_it(daemon: Daemon) -> None:
    """Idempotency keys are scoped to the agent: carol cannot follow bot's parked call."""
    call = keyed("park-other", "other.txt")
    first, approval_id = park(daemon, call, run_id=RUN)
    theirs = Streamer(daemon.address, [call], token=TOKENS["carol"], run_id=RUN)
    theirs.join()
    assert theirs.error is None, theirs.error
    assert not theirs.seen(EventKind.AWAITING_APPROVAL, "park-other"), theirs.events
    assert theirs.outcome("park-other").error_class == "duplicate_call_id"
    with as_(daemon, "alice") as alice:
        alice.deny(approval_id, "not today")
    first.join()
    assert first.outcome("park-other").error_class == "approval_denied"
    assert approvals_of(daemon, "park-other") == [approval_id]


def test_another_agent_resending_a_denied_call_gets_no_replay(daemon: Daemon) -> None:
    call = keyed("den-other", "den-other.txt")
    first, approval_id = park(daemon, call, run_id=RUN)
    with as_(daemon, "alice") as alice:
        alice.deny(approval_id, "no")
    first.join()
    theirs = Streamer(daemon.address, [call], token=TOKENS["carol"], run_id=RUN)
    theirs.join()
    assert theirs.error is None, theirs.error
    assert not theirs.seen(EventKind.AWAITING_APPROVAL, "den-other")
    assert theirs.outcome("den-other").error_class == "duplicate_call_id"
    assert approvals_of(daemon, "den-other") == [approval_id]
