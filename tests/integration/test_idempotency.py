"""Idempotency keys, through the real daemon: a side-effect counter proves "ran once"."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from execgate.client import Call, Client, Event, EventKind, Outcome, Status
from tests.daemon import Daemon
from tests.support import Streamer

# Runs on each journal store: SQLite, and PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.journals, pytest.mark.usefixtures("journal_store")]


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def bump(call_id: str, key: str, *, extra: str = "") -> Call:
    """A writing command whose every execution appends one line to `counter`."""
    return Call(
        tool="run_command",
        call_id=call_id,
        idempotency_key=key,
        arguments={"argv": ["sh", "-c", f"echo x >> counter{extra}"]},
    )


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_same_key_same_request_runs_once(daemon: Daemon, client: Client) -> None:
    counter = daemon.workspace / "counter"
    first = client.run(bump("first", "k1"))
    assert first.status is Status.SUCCESS
    assert first.replay_of == ""
    assert lines(counter) == 1

    second = client.run(bump("second", "k1"))
    assert second.call_id == "second"
    assert second.status is Status.SUCCESS
    assert second.replay_of == "first"
    assert second.evidence == first.evidence
    assert lines(counter) == 1

    rec = client.get_call("second")
    assert rec.replay_of == "first"
    assert rec.outcome is not None
    assert rec.outcome.status is Status.SUCCESS
    assert rec.outcome.replay_of == "first"
    original = client.get_call("first")
    assert original.idempotency_key == "k1"
    assert original.replay_of == ""

    # A third retry, in a batch with other work, is still a replay.
    third, other = client.execute([bump("third", "k1"), bump("other", "k-other")])
    assert third.replay_of == "first"
    assert other.replay_of == ""
    assert other.status is Status.SUCCESS
    assert lines(counter) == 2  # "other" ran, "third" did not


def test_same_key_joins_a_call_in_flight(daemon: Daemon, client: Client) -> None:
    counter = daemon.workspace / "counter"
    slow = Call(
        tool="run_command",
        call_id="owner",
        idempotency_key="k-slow",
        arguments={"argv": ["sh", "-c", "echo x >> counter; exec sleep 1"]},
    )
    events: list[Event] = []

    def stream() -> None:
        with Client(daemon.address) as c:
            events.extend(c.stream([slow]))

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    wait_until(lambda: any(e.kind is EventKind.STARTED for e in events), "the owner to start")
    joined = client.run(
        Call(tool=slow.tool, arguments=slow.arguments, call_id="joiner", idempotency_key="k-slow")
    )
    t.join(15)
    assert not t.is_alive()
    owner = next(e.outcome for e in events if e.kind is EventKind.FINISHED)
    assert owner is not None
    assert owner.status is Status.SUCCESS
    assert joined.status is Status.SUCCESS
    assert joined.replay_of == "owner"
    assert lines(counter) == 1
    assert client.get_call("joiner").replay_of == "owner"


def test_same_key_sent_concurrently_runs_once(daemon: Daemon) -> None:
    counter = daemon.workspace / "counter"
    argv = ["sh", "-c", "echo x >> counter; exec sleep 0.3"]
    barrier = threading.Barrier(2)
    outcomes: dict[str, Outcome] = {}

    def send(call_id: str) -> None:
        with Client(daemon.address) as c:
            c.list_tools()  # connect before the barrier, so both requests leave together
            barrier.wait(10)
            outcomes[call_id] = c.run(
                Call(
                    tool="run_command",
                    arguments={"argv": argv},
                    call_id=call_id,
                    idempotency_key="k-race",
                )
            )

    threads = [threading.Thread(target=send, args=(cid,), daemon=True) for cid in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
        assert not t.is_alive()
    assert lines(counter) == 1
    a, b = outcomes["a"], outcomes["b"]
    assert a.status is Status.SUCCESS
    assert b.status is Status.SUCCESS
    assert sorted([a.replay_of, b.replay_of]) in (["", "a"], ["", "b"])
    ran = "a" if a.replay_of == "" else "b"
    assert outcomes["b" if ran == "a" else "a"].replay_of == ran


def test_same_key_different_request_is_a_conflict(daemon: Daemon, client: Client) -> None:
    counter = daemon.workspace / "counter"
    assert client.run(bump("first", "k1")).status is Status.SUCCESS

    other = client.run(bump("changed", "k1", extra="2"))
    assert other.status is Status.REJECTED
    assert other.error_class == "idempotency_conflict"
    assert other.field == "idempotency_key"
    assert other.replay_of == ""
    assert lines(counter) == 1
    assert not (daemon.workspace / "counter2").exists()
    rec = client.get_call("changed")
    assert rec.outcome is not None
    assert rec.outcome.error_class == "idempotency_conflict"

    # Another tool with the same key is also a different request.
    read = client.run(
        Call(tool="read_file", arguments={"path": "counter"}, call_id="read", idempotency_key="k1")
    )
    assert read.status is Status.REJECTED
    assert read.error_class == "idempotency_conflict"

    # The conflict did not disturb the key: the original request still replays.
    again = client.run(bump("again", "k1"))
    assert again.replay_of == "first"
    assert lines(counter) == 1


def test_conflict_with_a_call_in_flight(daemon: Daemon, client: Client) -> None:
    slow = Call(
        tool="run_command",
        call_id="owner",
        idempotency_key="k-slow",
        arguments={"argv": ["sh", "-c", "echo x >> counter; exec sleep 1"]},
    )
    events: list[Event] = []

    def stream() -> None:
        with Client(daemon.address) as c:
            events.extend(c.stream([slow]))

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    wait_until(lambda: any(e.kind is EventKind.STARTED for e in events), "the owner to start")
    other = client.run(bump("other", "k-slow", extra="2"))
    assert other.status is Status.REJECTED
    assert other.error_class == "idempotency_conflict"
    t.join(15)
    assert not t.is_alive()
    assert lines(daemon.workspace / "counter") == 1
    assert not (daemon.workspace / "counter2").exists()


def test_rejected_call_does_not_consume_its_key(daemon: Daemon, client: Client) -> None:
    """A call refused before it ran binds nothing: the key is still free afterwards."""
    bad = client.run(
        Call(tool="run_command", arguments={"argv": []}, call_id="bad", idempotency_key="k-fresh")
    )
    assert bad.status is Status.REJECTED
    assert bad.error_class == "invalid_argument"
    unknown = client.run(Call(tool="no_such_tool", call_id="unknown", idempotency_key="k-fresh"))
    assert unknown.status is Status.REJECTED
    assert unknown.error_class == "unknown_tool"

    good = client.run(bump("good", "k-fresh"))
    assert good.status is Status.SUCCESS
    assert good.replay_of == ""
    assert lines(daemon.workspace / "counter") == 1
    assert client.run(bump("retry", "k-fresh")).replay_of == "good"


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_keys_survive_a_restart(daemon: Daemon, client: Client, how: str) -> None:
    counter = daemon.workspace / "counter"
    first = client.run(bump("first", "k-durable"))
    assert first.status is Status.SUCCESS
    if how == "stop":
        assert daemon.stop() == 0
    else:
        daemon.kill()
    daemon.start()

    retry = client.run(bump("retry", "k-durable"))
    assert retry.status is Status.SUCCESS
    assert retry.replay_of == "first"
    assert lines(counter) == 1
    conflict = client.run(bump("conflict", "k-durable", extra="2"))
    assert conflict.error_class == "idempotency_conflict"
    assert lines(counter) == 1


def test_resending_the_same_call_with_its_key_replays_it(daemon: Daemon, client: Client) -> None:
    counter = daemon.workspace / "counter"
    assert client.run(bump("same", "k-same")).status is Status.SUCCESS
    again = client.run(bump("same", "k-same"))  # a client resending its whole batch
    assert again.status is Status.SUCCESS
    assert again.replay_of == "same"
    assert lines(counter) == 1
    rec = client.get_call("same")  # the replay did not touch the original record
    assert rec.outcome is not None
    assert rec.outcome.status is Status.SUCCESS
    assert rec.idempotency_key == "k-same"
    assert rec.replay_of == ""


def test_resending_a_call_id_without_a_key_is_a_duplicate(daemon: Daemon, client: Client) -> None:
    counter = daemon.workspace / "counter"
    first = client.run(bump("nokey", ""))
    assert first.status is Status.SUCCESS, (first.message, first.text)
    again = client.run(bump("nokey", ""))
    assert again.status is Status.REJECTED
    assert again.error_class == "duplicate_call_id"
    assert again.field == "call_id"
    assert lines(counter) == 1


def test_keys_are_not_scoped_to_a_run(daemon: Daemon, client: Client) -> None:
    counter = daemon.workspace / "counter"
    assert client.run(bump("a", "k-shared"), run_id="run-a").ok
    other = client.run(bump("b", "k-shared"), run_id="run-b")
    assert other.replay_of == "a"
    assert lines(counter) == 1
    assert client.get_call("b", run_id="run-b").replay_of == "a"


def test_replays_and_taken_call_ids_are_not_logged_as_errors(
    daemon: Daemon, client: Client
) -> None:
    # A client resending its batch is an expected answer, not a daemon fault: no ERROR line.
    (daemon.workspace / "seen.txt").write_text("x")
    read = Call(tool="read_file", arguments={"path": "seen.txt"}, call_id="resent")
    keyed = Call(
        tool="read_file", arguments={"path": "seen.txt"}, call_id="keyed", idempotency_key="k"
    )
    outcomes = [client.execute([c], run_id="r-log")[0] for c in (read, read, keyed, keyed)]
    assert [o.status for o in outcomes][:2] == [Status.SUCCESS, Status.REJECTED]
    assert outcomes[1].error_class == "duplicate_call_id"
    assert outcomes[3].status is Status.SUCCESS  # the very same keyed call: a replay
    assert " ERROR " not in daemon.log(), daemon.log()


# ---------------------------------------------------------------- from a review of the scheduler


def _run() -> str:
    return "rev-" + uuid.uuid4().hex[:10]


def _work(path: str, *, write: bool, seconds: float, call_id: str, key: str = "") -> Call:
    return Call(
        tool="work",
        arguments={"path": path, "write": write, "seconds": seconds},
        call_id=call_id,
        idempotency_key=key,
    )


# ---------------------------------------------------------------------------------------
# BUG 3 (consistency): a client retrying its batch (same call id, same idempotency key)
# while the original is still running gets REJECTED/duplicate_call_id instead of joining
# it, though the docs say retry with the same key is how a disconnected client recovers.


def test_retry_of_running_call_with_same_id_and_key_joins(client: Client, daemon: Daemon) -> None:
    run = _run()
    call = _work("r.txt", write=True, seconds=1.0, call_id="r1", key="k-" + run)
    first = Streamer(daemon.address, [call], run_id=run)
    wait_until(lambda: first.seen(EventKind.STARTED, "r1"), "r1 started")
    retry = client.execute([call], run_id=run)[0]
    first.join(20)
    original = first.outcome("r1")
    assert original.status is Status.SUCCESS
    assert retry.status is Status.SUCCESS, (retry.status, retry.error_class, retry.message)


def test_retry_of_finished_call_with_same_id_and_key_is_replayed(client: Client) -> None:
    """Pinned (correct): the very same call resent after it finished is answered from
    the journal, with replay_of naming itself, and does not run again."""
    run = _run()
    call = _work("s.txt", write=True, seconds=0, call_id="s1", key="k-" + run)
    first = client.execute([call], run_id=run)[0]
    again = client.execute([call], run_id=run)[0]
    assert first.status is Status.SUCCESS
    assert again.status is Status.SUCCESS
    assert again.replay_of == "s1"
    assert again.text == first.text  # the counter read the same value: it ran once


# ---------------------------------------------------------------------------------------
# Pinned (correct): a joiner of an in-flight owner never hangs, and passes its turn so a
# later call of its batch is not held up by the owner's run.


def test_joiner_passes_turn_and_gets_owner_outcome(client: Client, daemon: Daemon) -> None:
    run = _run()
    key = "j-" + run
    owner = Streamer(
        daemon.address, [_work("j.txt", write=True, seconds=1.0, call_id="o", key=key)], run_id=run
    )
    wait_until(lambda: owner.seen(EventKind.STARTED, "o"), "owner started")
    t0 = time.monotonic()
    events = list(
        client.stream(
            [
                _work("j.txt", write=True, seconds=1.0, call_id="j", key=key),
                Call(tool="noop", arguments={"echo": "hi"}, call_id="n"),
            ],
            run_id=run,
        )
    )
    finished = {e.call_id: e for e in events if e.kind is EventKind.FINISHED}
    first_finished = next(e.call_id for e in events if e.kind is EventKind.FINISHED)
    assert first_finished == "n"  # the noop did not wait for the owner
    assert time.monotonic() - t0 < 10
    assert finished["j"].outcome is not None
    assert finished["j"].outcome.replay_of == "o"
    owner.join(20)
