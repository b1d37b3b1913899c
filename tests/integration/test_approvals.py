"""Approvals end to end through the real daemon: a policy `ask` rule parks a call, an
approver approves or denies it, its ttl expires it, and approvals outlive a daemon restart.

Identities: `bot` (agent) makes the calls, `alice` (approver) decides, `carol` (agent and
approver) makes calls she may not approve herself, `olga` (operator) and `root` (admin)
are not named by the rule. Nothing here sleeps: tests wait on events and journal rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execgate.client import (
    Approval,
    ApprovalNotPending,
    ApprovalState,
    Call,
    CallNotFound,
    Client,
    DaemonUnavailable,
    EventKind,
    ExecgateClientError,
    Outcome,
    PermissionDenied,
    Status,
)
from execgate.executor.server.auth import ACCESS
from execgate.v1 import executor_pb2 as pb
from tests.auth_support import Who, write_identities
from tests.daemon import Daemon
from tests.pg_support import journal_rows
from tests.support import Streamer, wait_until

# Runs on each journal store: SQLite, and PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.journals, pytest.mark.usefixtures("journal_store")]

TOKENS = {name: f"{name}-" + name[0] * 40 for name in ("bot", "alice", "carol", "olga", "root")}
PEOPLE = [
    Who("bot", ("agent",), token=TOKENS["bot"]),
    Who("alice", ("approver",), token=TOKENS["alice"]),
    Who("carol", ("agent", "approver"), token=TOKENS["carol"]),
    Who("olga", ("operator",), token=TOKENS["olga"]),
    Who("root", ("admin",), token=TOKENS["root"]),
]
POLICY = """\
version: 1
default: deny
rules:
  - id: files
    effect: allow
    tools: [read_file, write_file, list_dir]
    reason: files are fine
  - id: commands
    effect: ask
    tools: [run_command]
    argv_prefix: [[touch]]
    approvers: [approver]
    ttl: 60
    reason: commands need a human
  - id: quick
    effect: ask
    tools: [run_command]
    argv_prefix: [["true"]]
    approvers: [approver]
    ttl: 1
    reason: asks briefly
"""


def start(root: Path) -> Daemon:
    root.mkdir(parents=True, exist_ok=True)
    identities = write_identities(root / "identities.yaml", PEOPLE)
    policy = root / "policy.yaml"
    policy.write_text(POLICY)
    home = root / "daemon"
    home.mkdir(exist_ok=True)
    return Daemon(
        home, "--identities", str(identities), "--policy", str(policy), "--sandbox", "process"
    ).start()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, journal_store: str) -> Iterator[Daemon]:
    """The module's daemon, on the journal store of this round (journal_store)."""
    d = start(tmp_path_factory.mktemp("approvals"))
    yield d
    if d.proc is not None and d.proc.poll() is None:
        d.stop()


def as_(daemon: Daemon, who: str) -> Client:
    return Client(daemon.address, token=TOKENS[who])


def touch(call_id: str, name: str, run_id: str = "appr") -> Call:
    return Call(tool="run_command", arguments={"argv": ["touch", name]}, call_id=call_id)


def park(
    daemon: Daemon, call: Call, who: str = "bot", run_id: str = "appr"
) -> tuple[Streamer, str]:
    """Stream `call` as `who` until it is awaiting approval; returns the stream and the id."""
    stream = Streamer(daemon.address, [call], token=TOKENS[who], run_id=run_id)
    wait_until(
        lambda: stream.seen(EventKind.AWAITING_APPROVAL, call.call_id) or stream.error,
        f"{call.call_id} awaiting approval",
    )
    assert stream.error is None, stream.error
    event = next(e for e in stream.events if e.kind is EventKind.AWAITING_APPROVAL)
    assert event.approval_id
    return stream, event.approval_id


_APPROVAL_COLUMNS = ("state", "decided_by", "requester", "decided_at", "created_at", "comment")


def approval_row(daemon: Daemon, approval_id: str) -> dict[str, Any]:
    found = journal_rows(
        daemon.root,
        daemon.state_dir,
        f"SELECT {', '.join(_APPROVAL_COLUMNS)} FROM approvals WHERE id=?",
        (approval_id,),
    )
    assert found, f"no approvals row {approval_id}"
    return dict(zip(_APPROVAL_COLUMNS, found[0], strict=True))


def pending_ids(daemon: Daemon) -> set[str]:
    with as_(daemon, "alice") as alice:
        return {a.approval_id for a in alice.approvals_pending()}


# ---------------------------------------------------------------- approve, deny, expire


def test_approved_call_runs_and_the_decision_is_journaled(daemon: Daemon) -> None:
    stream, approval_id = park(daemon, touch("ok-1", "approved.txt"))
    event = next(e for e in stream.events if e.kind is EventKind.AWAITING_APPROVAL)
    assert (event.rule_id, event.reason) == ("commands", "commands need a human")
    assert event.expires_at is not None
    assert event.expires_at > event.at
    # The durable row exists before the event was sent.
    assert approval_row(daemon, approval_id)["state"] == "pending"
    assert not (daemon.workspace / "approved.txt").exists()

    with as_(daemon, "alice") as alice:
        [listed] = [a for a in alice.approvals_pending() if a.approval_id == approval_id]
        assert (listed.requester, listed.tool, listed.call_id) == ("bot", "run_command", "ok-1")
        assert listed.approvers == ("approver",)
        decided = alice.approve(approval_id, "looks fine")
    assert (decided.state, decided.decided_by, decided.comment) == (
        ApprovalState.APPROVED,
        "alice",
        "looks fine",
    )
    stream.join()
    outcome = stream.outcome("ok-1")
    assert outcome.status is Status.SUCCESS, outcome
    assert (daemon.workspace / "approved.txt").exists()
    row = approval_row(daemon, approval_id)
    assert (row["state"], row["decided_by"], row["requester"]) == ("approved", "alice", "bot")
    started = outcome.mark("started")
    assert started is not None
    assert row["decided_at"] <= started.at
    with as_(daemon, "bot") as bot:
        record = bot.get_call("ok-1", run_id="appr")
    assert record.policy is not None
    assert (record.policy.effect, record.policy.rule_ids) == ("ask", ("commands",))


def test_denied_call_is_rejected_and_never_runs(daemon: Daemon) -> None:
    stream, approval_id = park(daemon, touch("no-1", "denied.txt"))
    with as_(daemon, "alice") as alice:
        alice.deny(approval_id, "not on a Friday")
    stream.join()
    outcome = stream.outcome("no-1")
    assert (outcome.status, outcome.error_class) == (Status.REJECTED, "approval_denied")
    assert "not on a Friday" in outcome.message
    assert "alice" in outcome.message
    assert not (daemon.workspace / "denied.txt").exists()
    assert approval_row(daemon, approval_id)["state"] == "denied"
    with as_(daemon, "bot") as bot:
        recorded = bot.get_call("no-1", run_id="appr").outcome
    assert recorded is not None
    assert recorded.error_class == "approval_denied"
    # Decided once: a second decision is refused.
    with as_(daemon, "alice") as alice, pytest.raises(ApprovalNotPending):
        alice.approve(approval_id)


def test_undecided_call_expires_after_its_ttl(daemon: Daemon) -> None:
    call = Call(tool="run_command", arguments={"argv": ["true"]}, call_id="late-1")
    stream, approval_id = park(daemon, call)
    stream.join()
    outcome = stream.outcome("late-1")
    assert (outcome.status, outcome.error_class) == (Status.REJECTED, "approval_expired")
    row = approval_row(daemon, approval_id)
    assert (row["state"], row["decided_by"]) == ("expired", "")
    with as_(daemon, "alice") as alice, pytest.raises(ApprovalNotPending):
        alice.approve(approval_id)


# ---------------------------------------------------------------- who may decide


def test_nobody_but_a_named_approver_other_than_the_requester_may_decide(
    daemon: Daemon,
) -> None:
    # carol is an approver, but she made this call.
    stream, approval_id = park(daemon, touch("self-1", "self.txt"), who="carol")
    for who in ("carol", "bot", "olga", "root"):
        # carol: self-approval; bot: an agent; olga: an operator; root: an admin the
        # rule does not name (approvers: [approver]).
        with as_(daemon, who) as c, pytest.raises(PermissionDenied):
            c.approve(approval_id, "let me")
        with as_(daemon, who) as c, pytest.raises(PermissionDenied):
            c.deny(approval_id, "no")
    assert approval_id in pending_ids(daemon)
    assert approval_row(daemon, approval_id)["state"] == "pending"
    assert not stream.seen(EventKind.FINISHED, "self-1")
    with as_(daemon, "bot") as bot, pytest.raises(PermissionDenied):
        bot.approvals_pending()  # agents do not see the queue either
    with as_(daemon, "alice") as alice:
        alice.deny(approval_id, "cleanup")
    stream.join()
    assert stream.outcome("self-1").error_class == "approval_denied"
    assert not (daemon.workspace / "self.txt").exists()


def test_unknown_approval_id(daemon: Daemon) -> None:
    with as_(daemon, "alice") as alice, pytest.raises(ApprovalNotPending):
        alice.approve("appr_nope")


def test_every_approvals_rpc_has_a_row_in_the_role_table() -> None:
    methods = pb.DESCRIPTOR.services_by_name["Approvals"].methods_by_name
    rows = {m for m in ACCESS if m.startswith("/execgate.v1.Approvals/")}
    assert rows == {f"/execgate.v1.Approvals/{m}" for m in methods}
    assert {str(r) for r in ACCESS["/execgate.v1.Approvals/Decide"]} == {"approver", "admin"}


# ---------------------------------------------------------------- no locks while parked


def test_a_parked_call_holds_no_locks(daemon: Daemon) -> None:
    # run_command takes a write lock on the whole workspace once it may run.
    stream, approval_id = park(daemon, touch("lock-1", "after.txt"))
    with as_(daemon, "bot") as bot:
        outcome = bot.run(
            Call(tool="write_file", arguments={"path": "meanwhile.txt", "content": "x"}),
            run_id="other",
        )
    assert outcome.status is Status.SUCCESS, outcome
    assert not stream.seen(EventKind.WAITING, "lock-1")
    assert approval_id in pending_ids(daemon)
    with as_(daemon, "alice") as alice:
        alice.approve(approval_id)
    stream.join()
    assert stream.outcome("lock-1").status is Status.SUCCESS
    assert (daemon.workspace / "after.txt").exists()


# ---------------------------------------------------------------- watch


def test_watch_streams_pending_and_decided_approvals(daemon: Daemon) -> None:
    seen: list[Approval] = []
    watcher = as_(daemon, "olga")  # operators may watch (not decide)

    def follow() -> None:
        with contextlib.suppress(ExecgateClientError):  # the channel closes under it
            seen.extend(watcher.watch_approvals())

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    stream, approval_id = park(daemon, touch("watch-1", "watched.txt"))
    wait_until(
        lambda: any(a.approval_id == approval_id for a in list(seen)), "the pending approval"
    )
    with as_(daemon, "alice") as alice:
        alice.deny(approval_id, "watched")
    wait_until(
        lambda: any(
            a.approval_id == approval_id and a.state is ApprovalState.DENIED for a in list(seen)
        ),
        "the decision",
    )
    watcher.close()
    thread.join(10)
    stream.join()


# ---------------------------------------------------------------- restart


def outcome_when_recorded(daemon: Daemon, call_id: str, run_id: str = "r") -> Outcome:
    """The call's outcome once the restarted daemon has recorded it (no stream follows
    a call resumed after a restart: GetCall is how its agent learns the outcome)."""
    found: list[Outcome] = []
    with as_(daemon, "bot") as bot:

        def recorded() -> bool:
            with contextlib.suppress(CallNotFound):
                outcome = bot.get_call(call_id, run_id=run_id).outcome
                found.extend([outcome] if outcome is not None else [])
            return bool(found)

        wait_until(recorded, f"{call_id} recorded")
    return found[0]


def calls_with_id(daemon: Daemon, call_id: str) -> int:
    found = journal_rows(
        daemon.root, daemon.state_dir, "SELECT count(*) FROM calls WHERE call_id=?", (call_id,)
    )
    return int(found[0][0])  # type: ignore[call-overload]


def test_a_call_pending_when_the_daemon_dies_runs_once_approved_after_restart(
    tmp_path: Path,
) -> None:
    daemon = start(tmp_path)
    try:
        stream, approval_id = park(daemon, touch("crash-1", "later.txt"), run_id="r")
        daemon.kill()
        stream.join()
        daemon.restart()
        assert approval_id in pending_ids(daemon)
        assert approval_row(daemon, approval_id)["state"] == "pending"
        assert not (daemon.workspace / "later.txt").exists()
        with as_(daemon, "alice") as alice:
            decided = alice.approve(approval_id, "fine after the restart")
        assert decided.state is ApprovalState.APPROVED
        outcome = outcome_when_recorded(daemon, "crash-1")
        assert outcome.status is Status.SUCCESS, outcome
        assert (daemon.workspace / "later.txt").exists()
        # It ran once: one row, its queued mark from before the crash.
        assert calls_with_id(daemon, "crash-1") == 1
        queued = outcome.mark("queued")
        assert queued is not None
        assert queued.at == pytest.approx(approval_row(daemon, approval_id)["created_at"])
    finally:
        daemon.stop()


def test_a_graceful_stop_detaches_pending_calls_and_a_denial_after_restart_rejects(
    tmp_path: Path,
) -> None:
    daemon = start(tmp_path)
    try:
        stream, approval_id = park(daemon, touch("stop-1", "never.txt"), run_id="r")
        daemon.stop()
        stream.join()
        # The stream ends with a typed error naming the parked call and its approval.
        assert isinstance(stream.error, DaemonUnavailable), stream.error
        # (Seen once on PostgreSQL under load: the stream reset without the error. The
        # daemon's log says why if it happens again.)
        assert "stop-1" in str(stream.error), daemon.log()[-4000:]
        assert approval_id in str(stream.error)
        daemon.restart()
        assert approval_row(daemon, approval_id)["state"] == "pending"
        with as_(daemon, "alice") as alice:
            alice.deny(approval_id, "not today")
        outcome = outcome_when_recorded(daemon, "stop-1")
        assert (outcome.status, outcome.error_class) == (Status.REJECTED, "approval_denied")
        assert "not today" in outcome.message
        assert not (daemon.workspace / "never.txt").exists()
    finally:
        daemon.stop()


def test_a_batch_caller_also_learns_its_parked_call_was_detached(tmp_path: Path) -> None:
    """ExecuteBatch (`Client.execute`) reports outcomes only: the detach still reaches
    it, naming the approval, and the daemon does not wait out its grace for it."""
    daemon = start(tmp_path)
    try:
        errors: list[BaseException] = []

        def batch() -> None:
            with as_(daemon, "bot") as bot:
                try:
                    bot.execute([touch("batch-1", "later.txt")], run_id="r")
                except ExecgateClientError as exc:
                    errors.append(exc)

        worker = threading.Thread(target=batch)
        worker.start()
        wait_until(lambda: bool(pending_ids(daemon)), "the batch's call parked")
        (approval_id,) = pending_ids(daemon)
        daemon.stop()
        worker.join(10)
        assert len(errors) == 1
        assert isinstance(errors[0], DaemonUnavailable), errors
        assert "batch-1" in str(errors[0])
        assert approval_id in str(errors[0])
        daemon.restart()
        assert approval_row(daemon, approval_id)["state"] == "pending"
    finally:
        daemon.stop()


def test_the_ttl_keeps_counting_while_no_daemon_runs(tmp_path: Path) -> None:
    daemon = start(tmp_path)
    try:
        call = Call(tool="run_command", arguments={"argv": ["true"]}, call_id="ttl-1")
        stream, approval_id = park(daemon, call, run_id="r")
        daemon.kill()
        stream.join()
        daemon.restart()
        outcome = outcome_when_recorded(daemon, "ttl-1")
        assert (outcome.status, outcome.error_class) == (Status.REJECTED, "approval_expired")
        assert approval_row(daemon, approval_id)["state"] == "expired"
    finally:
        daemon.stop()


def test_a_parked_call_the_new_policy_denies_is_rejected_at_restart(tmp_path: Path) -> None:
    daemon = start(tmp_path)
    try:
        stream, approval_id = park(daemon, touch("deny-1", "never.txt"), run_id="r")
        daemon.kill()
        stream.join()
        policy = tmp_path / "policy.yaml"
        deny_touch = (
            "  - id: no-touch\n    effect: deny\n    tools: [run_command]\n"
            "    argv_prefix: [[touch]]\n    reason: no more touching\n"
        )
        policy.write_text(policy.read_text() + deny_touch)
        daemon.restart()
        outcome = outcome_when_recorded(daemon, "deny-1")
        assert (outcome.status, outcome.error_class) == (Status.REJECTED, "policy_denied")
        row = approval_row(daemon, approval_id)
        assert row["state"] == "expired"
        assert "policy now in force denies" in row["comment"]
        assert not (daemon.workspace / "never.txt").exists()
    finally:
        daemon.stop()


# ---------------------------------------------------------------- CLI


def cli(daemon: Daemon, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EXECGATE_TOKEN": TOKENS[who]}
    return subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", *args, "--addr", daemon.address],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


def test_cli_lists_denies_and_refuses_self_approval(daemon: Daemon) -> None:
    stream, approval_id = park(daemon, touch("cli-1", "cli.txt"), who="carol")
    listed = cli(daemon, "alice", "approvals", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert approval_id in {a["approval_id"] for a in json.loads(listed.stdout)}
    mine = cli(daemon, "carol", "approvals", "approve", approval_id)
    assert mine.returncode == 1
    assert "nobody approves their own calls" in mine.stderr
    denied = cli(daemon, "alice", "approvals", "deny", approval_id, "--comment", "via cli")
    assert denied.returncode == 0, denied.stderr
    assert "DENIED" in denied.stdout
    stream.join()
    assert stream.outcome("cli-1").error_class == "approval_denied"


# ---------------------------------------------------------------- may_decide (unit)


def test_may_decide_needs_the_role_a_named_approver_and_someone_else() -> None:
    from execgate.executor.pipeline.approve import Approval as Parked
    from execgate.executor.pipeline.approve import ApprovalState as State
    from execgate.executor.pipeline.approve import may_decide
    from execgate.executor.policy.identity import Identity, Role

    parked = Parked(
        id="a", run_id="r", call_id="c", batch_id="b", tool="run_command",
        arguments_json="{}", requester="carol", rule_id="q", reason="",
        approvers=("approver", "dave"), created_at=0.0, expires_at=1.0, state=State.PENDING,
    )  # fmt: skip

    def who(name: str, *roles: Role) -> Identity:
        return Identity(name=name, roles=frozenset(roles))

    assert may_decide(parked, who("alice", Role.APPROVER)) == ""  # by role
    assert may_decide(parked, who("dave", Role.ADMIN)) == ""  # by name
    assert "own calls" in may_decide(parked, who("carol", Role.APPROVER, Role.AGENT))
    assert "neither" in may_decide(parked, who("dave", Role.AGENT))  # named, but no role
    assert "none of them" in may_decide(parked, who("root", Role.ADMIN))
