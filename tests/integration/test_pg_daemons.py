"""Three real daemons on one workspace and one PostgreSQL (`--journal postgresql://...
--locks postgresql`), the session's throwaway server (tests/pg_support.py): conflicting
writes serialized across them, reads together, a SIGKILLed daemon's calls settled and its
locks freed within its lease, approvals and cancels that reach the daemon running the call,
idempotent retries that never run twice, and a server restart under load.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execgate.client import (
    Call,
    CallNotFound,
    CancelNotice,
    Client,
    EventKind,
    ExecgateClientError,
    Outcome,
    Status,
)
from execgate.client.loop.states import Machine, State, Transition
from tests.auth_support import Who, write_identities
from tests.daemon import Daemon, give, reachable_workspace, scaled
from tests.loop_support import Background
from tests.pg_support import PgServer, pg_rows
from tests.support import Streamer, wait_until

# Three daemons start per test: minutes on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

LEASE = 2.0
GRACE = 1.0
TOKENS = {name: f"{name}-" + name[0] * 40 for name in ("bot", "alice", "olga")}
PEOPLE = [
    Who("bot", ("agent",), token=TOKENS["bot"]),
    Who("alice", ("approver",), token=TOKENS["alice"]),
    Who("olga", ("operator",), token=TOKENS["olga"]),
]
POLICY = """\
version: 1
default: deny
rules:
  - id: tools
    effect: allow
    tools: [run_command, work, noop, read_file, write_file, list_dir]
    reason: the test's tools
  - id: touch-asks
    effect: ask
    tools: [run_command]
    argv_prefix: [[touch]]
    approvers: [approver]
    ttl: 60
    reason: a human says when
"""
# Read the counter, write it plus one, log the call's label: a lost update if two overlap.
INCREMENT = 'n=$(cat counter); echo $((n + 1)) > counter; echo "$0" >> order.log'


@dataclass
class Trio:
    daemons: list[Daemon]
    workspace: Path
    url: str

    def client(self, i: int, who: str = "bot") -> Client:
        return Client(self.daemons[i].address, token=TOKENS[who])

    def rows(self, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        return pg_rows(self.url, query, params)


@contextlib.contextmanager
def three_daemons(tmp_path: Path, server: PgServer, lease: float) -> Iterator[Trio]:
    """Three daemons on one workspace and one database, each with a lease of `lease`."""
    url = server.database("t" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:16])
    workspace = tmp_path / "ws"
    reachable_workspace(workspace)
    identities = write_identities(tmp_path / "identities.yaml", PEOPLE)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    daemons = []
    for i in (1, 2, 3):
        (tmp_path / f"d{i}").mkdir()
        d = Daemon(
            tmp_path / f"d{i}",
            *("--journal", url, "--locks", "postgresql", "--lease", str(lease)),
            *("--identities", str(identities), "--policy", str(policy)),
            *("--grace", str(GRACE)),
        )
        d.workspace = workspace  # one workspace, three state dirs
        daemons.append(d)
    try:
        for d in daemons:
            d.start()
        yield Trio(daemons, workspace, url)
    finally:
        for d in daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()


@pytest.fixture
def trio(tmp_path: Path, pg_server: PgServer) -> Iterator[Trio]:
    with three_daemons(tmp_path, pg_server, LEASE) as three:
        yield three


def _file(trio: Trio, name: str, text: str) -> Path:
    """A file the commands may change: under bwrap a root daemon's commands are uid 0
    without capabilities, under `process` the run-as user."""
    path = trio.workspace / name
    path.write_text(text)
    path.chmod(0o666)
    return give(path)


def _span(outcome: Outcome) -> tuple[float, float]:
    """When the call's work ran: from its start to its last mark of running."""
    started = outcome.mark("started")
    assert started is not None, outcome
    ends = [m.at for m in outcome.timeline if m.phase in ("stopped", "finished")]
    return started.at, min(ends)


def test_increments_spread_over_three_daemons_are_serialized(trio: Trio) -> None:
    _file(trio, "counter", "0\n")
    _file(trio, "order.log", "")
    outcomes: list[Outcome] = []
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            with trio.client(k % 3) as c:
                for b in range(5):
                    calls = [
                        Call(
                            tool="run_command",
                            arguments={"argv": ["sh", "-c", INCREMENT, f"{k}-{b}-{i}"]},
                        )
                        for i in (0, 1)
                    ]
                    outcomes.extend(c.execute(calls, run_id=f"inc-{k}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(240))
    assert not errors, errors
    assert len(outcomes) == 60
    assert all(o.status is Status.SUCCESS for o in outcomes), [
        (o.status, o.message) for o in outcomes if o.status is not Status.SUCCESS
    ]
    assert (trio.workspace / "counter").read_text().strip() == "60"
    spans = sorted(_span(o) for o in outcomes)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, f"two increments overlap: one ended at {end}, one began at {start}"
    order = (trio.workspace / "order.log").read_text().split()
    assert len(order) == 60
    for k in range(6):
        for b in range(5):
            assert order.index(f"{k}-{b}-0") < order.index(f"{k}-{b}-1"), (k, b)
    # Every daemon ran some: the lock table really was shared.
    ran_on = trio.rows("SELECT count(DISTINCT daemon) FROM calls WHERE tool = 'run_command'")
    assert ran_on == [(3,)]


def test_reads_on_different_daemons_run_together(trio: Trio) -> None:
    _file(trio, "data", "7\n")
    found: dict[int, Outcome] = {}

    def read(i: int) -> None:
        with trio.client(i) as c:
            found[i] = c.execute_one("work", path="data", seconds=1.5)

    threads = [threading.Thread(target=read, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(60))
    assert {o.status for o in found.values()} == {Status.SUCCESS}
    (s0, e0), (s1, e1) = _span(found[0]), _span(found[1])
    assert max(s0, s1) < min(e0, e1), "the two reads did not run at the same time"


def test_a_killed_daemon_settles_its_calls_and_frees_its_locks_within_the_lease(
    trio: Trio,
) -> None:
    d1, d2, _ = trio.daemons
    hold = Call(tool="run_command", arguments={"argv": ["sleep", "60"]}, call_id="hold")
    queued = Call(tool="run_command", arguments={"argv": ["true"]}, call_id="queued-d1")
    on_d1 = Streamer(d1.address, [hold, queued], token=TOKENS["bot"], run_id="k")
    wait_until(lambda: on_d1.seen(EventKind.STARTED, "hold"), "hold running on d1")
    wait_until(lambda: on_d1.seen(EventKind.WAITING, "queued-d1"), "queued-d1 waiting on d1")
    after = Call(
        tool="run_command",
        arguments={"argv": ["sh", "-c", "echo after > after.txt"]},
        call_id="waiter-d2",
    )
    on_d2 = Streamer(d2.address, [after], token=TOKENS["bot"], run_id="k2")
    wait_until(lambda: on_d2.seen(EventKind.WAITING, "waiter-d2"), "waiter-d2 waiting on d2")

    d1.kill()
    killed = time.time()
    on_d1.join()
    on_d2.join(scaled(LEASE + 20))
    assert on_d2.error is None, on_d2.error
    waited = on_d2.outcome("waiter-d2")
    assert waited.status is Status.SUCCESS, waited
    granted = waited.mark("lock_granted")
    assert granted is not None
    assert granted.at - killed <= scaled(LEASE), "d1's locks outlived its lease"
    assert (trio.workspace / "after.txt").read_text() == "after\n"

    with trio.client(2) as c:
        settled = c.get_call("hold", run_id="k").outcome
        assert settled is not None
        assert (settled.status, settled.error_class) == (Status.UNKNOWN_OUTCOME, "interrupted")
        assert settled.mark("recovered") is not None
        # Queued on d1 when it died: it never started, so it has no record at all.
        with pytest.raises(CallNotFound):
            c.get_call("queued-d1", run_id="k")
        assert c.execute_one("noop", echo="still here").status is Status.SUCCESS

    before = trio.rows("SELECT finished_at, outcome_json FROM calls WHERE call_id = 'hold'")
    d1.restart()
    assert "recovered" not in d1.log().split("execgate listening")[-1]
    assert trio.rows("SELECT finished_at, outcome_json FROM calls WHERE call_id = 'hold'") == before
    with trio.client(0) as c:
        assert c.execute_one("noop", echo="back").status is Status.SUCCESS


def test_an_ask_parked_on_one_daemon_is_approved_through_another_and_runs_once(
    trio: Trio,
) -> None:
    d1 = trio.daemons[0]
    call = Call(tool="run_command", arguments={"argv": ["touch", "approved.txt"]}, call_id="ask-1")
    stream = Streamer(d1.address, [call], token=TOKENS["bot"], run_id="appr")
    wait_until(lambda: stream.seen(EventKind.AWAITING_APPROVAL, "ask-1"), "ask-1 parked on d1")
    with trio.client(2, "alice") as alice:
        (pending,) = alice.approvals_pending()
        assert pending.call_id == "ask-1"
        alice.approve(pending.approval_id, "through d3")
    stream.join(scaled(30))
    assert stream.error is None, stream.error
    assert stream.outcome("ask-1").status is Status.SUCCESS
    assert (trio.workspace / "approved.txt").exists()
    assert trio.rows("SELECT count(*) FROM calls WHERE call_id = 'ask-1'") == [(1,)]
    ran_on = trio.rows("SELECT d.name FROM calls c JOIN daemons d ON d.id = c.daemon")
    assert len(ran_on) == 1
    assert str(d1.state_dir.resolve()) in str(ran_on[0][0])


def test_a_run_cancelled_through_one_daemon_stops_its_call_on_another(trio: Trio) -> None:
    d1 = trio.daemons[0]
    with trio.client(0) as c:
        run_id = c.runs.start("sleep a while").run_id
    call = Call(tool="run_command", arguments={"argv": ["sleep", "60"]}, call_id="long")
    stream = Streamer(d1.address, [call], token=TOKENS["bot"], run_id=run_id)
    wait_until(lambda: stream.seen(EventKind.STARTED, "long"), "long running on d1")
    with trio.client(1) as c:
        cancelled = c.runs.cancel(run_id, reason="stop it from d2")
    stream.join(scaled(30))
    assert stream.error is None, stream.error
    outcome = stream.outcome("long")
    assert outcome.error_class == "cancelled", outcome
    stopped = outcome.mark("stopped")
    assert stopped is not None
    assert cancelled.cancel is not None
    assert stopped.at - cancelled.cancel.at <= GRACE + scaled(0.2)
    with trio.client(2) as c:  # the run is barred everywhere now
        (later,) = c.execute([Call(tool="noop", arguments={})], run_id=run_id)
        assert (later.status, later.field) == (Status.REJECTED, "run_id")


def test_an_idempotent_retry_on_another_daemon_after_the_first_died_never_runs_twice(
    trio: Trio,
) -> None:
    d1 = trio.daemons[0]
    _file(trio, "ran.log", "")
    script = "echo ran >> ran.log; sleep 60"
    first = Call(
        tool="run_command",
        arguments={"argv": ["sh", "-c", script]},
        call_id="keyed-1",
        idempotency_key="only-once",
    )
    stream = Streamer(d1.address, [first], token=TOKENS["bot"], run_id="idem")
    wait_until(lambda: (trio.workspace / "ran.log").read_text() == "ran\n", "the first ran")
    d1.kill()
    stream.join()
    retry = Call(
        tool="run_command",
        arguments={"argv": ["sh", "-c", script]},
        call_id="keyed-2",
        idempotency_key="only-once",
    )
    with trio.client(1) as c:
        (replayed,) = c.execute([retry], run_id="idem")
    assert replayed.replay_of == "keyed-1", replayed
    assert (replayed.status, replayed.error_class) == (Status.UNKNOWN_OUTCOME, "interrupted")
    assert (trio.workspace / "ran.log").read_text() == "ran\n"


def test_a_server_restart_under_load_loses_nothing_acknowledged(
    tmp_path: Path, pg_server: PgServer
) -> None:
    # A lease longer than the restart: nobody is reaped, every daemon carries on.
    with three_daemons(tmp_path, pg_server, 30.0) as trio:
        _restart_under_load(trio, pg_server)


def _restart_under_load(trio: Trio, pg_server: PgServer) -> None:
    acknowledged: dict[str, Outcome] = {}
    failures: list[BaseException] = []
    stop = threading.Event()

    def writer(k: int) -> None:
        n = 0
        with trio.client(k % 3) as c:
            while not stop.is_set() and n < 200:
                call_id = f"w{k}-{n}"
                call = Call(
                    tool="write_file",
                    arguments={
                        "path": f"out/{call_id}.txt",
                        "content": call_id,
                        "create_dirs": True,
                    },
                    call_id=call_id,
                    idempotency_key=call_id,
                )
                try:
                    (outcome,) = c.execute([call], run_id=f"load-{k}")
                except ExecgateClientError as exc:  # a typed error, never a hang
                    failures.append(exc)
                else:
                    acknowledged[call_id] = outcome
                n += 1

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acknowledged) >= 30, "calls flowing", timeout=scaled(60))
    pg_server.restart()
    during = len(acknowledged)
    wait_until(lambda: len(acknowledged) >= during + 30, "calls flowing again", scaled(60))
    stop.set()
    for t in threads:
        t.join(scaled(60))
    assert not any(t.is_alive() for t in threads)
    statuses = {o.status for o in acknowledged.values()}
    assert statuses <= {Status.SUCCESS, Status.FAILURE, Status.REJECTED}, statuses
    # Whatever a client was told is on record, through any daemon, the same.
    for i, (call_id, told) in enumerate(sorted(acknowledged.items())):
        k = call_id[1:].split("-")[0]
        with trio.client(i % 3) as c:
            recorded = c.get_call(call_id, run_id=f"load-{k}").outcome
        assert recorded is not None
        assert recorded.status is told.status, call_id
        if told.status is Status.SUCCESS:
            assert (trio.workspace / "out" / f"{call_id}.txt").read_text() == call_id
    for d in trio.daemons:
        assert d.serving()
    with contextlib.ExitStack() as stack:
        for i in range(3):
            c = stack.enter_context(trio.client(i))
            assert c.execute_one("noop", echo="after").status is Status.SUCCESS


def test_a_run_is_watched_listed_and_appended_to_from_any_daemon(trio: Trio) -> None:
    with trio.client(0) as c1, trio.client(1) as c2, trio.client(2, "olga") as olga:
        run_id = c1.runs.start("watched from elsewhere").run_id
        machine = Machine(run_id)
        c1.runs.append(run_id, [machine.advance(State.REQUESTING_MODEL, "go")])
        seen: list[Transition | CancelNotice] = []

        def watch() -> list[Transition | CancelNotice]:
            seen.extend(olga.runs.watch(run_id))  # an operator, through daemon 3
            return seen

        watcher = Background(watch)
        wait_until(lambda: len(seen) == 1, "the history, through daemon 3")
        # Appended through daemon 2: daemon 1's cached history is stale, not trusted.
        c2.runs.append(run_id, [machine.advance(State.VALIDATING, "replied")])
        wait_until(lambda: len(seen) == 2, "daemon 2's event, on daemon 3's stream")
        c1.runs.cancel(run_id, reason="enough")
        wait_until(lambda: len(seen) == 3, "daemon 1's cancel, on daemon 3's stream")
        c1.runs.append(run_id, [machine.advance(State.CANCELLED, "cancelled: enough")])
        got = watcher.result(timeout=scaled(15))
        assert [u.seq for u in got if isinstance(u, Transition)] == [1, 2, 3]
        assert [n.reason for n in got if isinstance(n, CancelNotice)] == ["enough"]
        # Every daemon lists it, ended; and refuses its calls (the run ended elsewhere).
        for c in (c1, c2):
            assert [r.run_id for r in c.runs.find(states=["cancelled"])] == [run_id]
        wait_until(
            lambda: (
                c2.execute([Call(tool="noop", arguments={})], run_id=run_id)[0].status
                is Status.REJECTED
            ),
            "daemon 2 refusing calls of the ended run",
            timeout=scaled(10),
        )


def test_a_call_parked_on_a_daemon_that_died_is_adopted_and_runs_once_approved(
    trio: Trio,
) -> None:
    d1 = trio.daemons[0]
    call = Call(tool="run_command", arguments={"argv": ["touch", "adopted.txt"]}, call_id="ask-2")
    stream = Streamer(d1.address, [call], token=TOKENS["bot"], run_id="adopt")
    wait_until(lambda: stream.seen(EventKind.AWAITING_APPROVAL, "ask-2"), "ask-2 parked on d1")
    d1.kill()
    stream.join()
    # Its reaper parks the call itself: the approval's daemon is a live one again. (Until
    # d1 is reaped its row still says alive: wait for the reap, which adopts in the same
    # transaction, before deciding.)
    reaped = "SELECT count(*) FROM daemons WHERE state = 'reaped'"
    wait_until(lambda: trio.rows(reaped) == [(1,)], "d1 reaped", scaled(LEASE + 10))
    parked_on = "SELECT d.state FROM approvals a JOIN daemons d ON d.id = a.daemon"
    assert trio.rows(parked_on) == [("alive",)]
    with trio.client(2, "alice") as alice:
        (pending,) = alice.approvals_pending()
        alice.approve(pending.approval_id, "after its daemon died")
    found: list[Outcome] = []

    def recorded() -> bool:
        with trio.client(1) as c, contextlib.suppress(CallNotFound):
            outcome = c.get_call("ask-2", run_id="adopt").outcome
            found.extend([outcome] if outcome is not None else [])
        return bool(found)

    wait_until(recorded, "ask-2 run by its adopter", scaled(30))
    assert found[0].status is Status.SUCCESS, found[0]
    assert (trio.workspace / "adopted.txt").exists()
    assert trio.rows("SELECT count(*) FROM calls WHERE call_id = 'ask-2'") == [(1,)]
