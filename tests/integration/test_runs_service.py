"""The Runs service through a real daemon: StartRun, AppendEvents (and every way it
refuses), GetRun, ListRuns, CancelRun, WatchRun, and the Executor refusing the tool
calls of a run that has ended.

Identities (tests/loop_support.py): `bot` and `bob` are agents, `olga` an operator,
`root` an admin. Events are made with the loop's own `Machine`, so a refusal here is the
daemon's judgement of a history, not of a malformed test.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from execgate.client import (
    Call,
    CancelNotice,
    Client,
    EventKind,
    PermissionDenied,
    RunNotFound,
    RunRefused,
    Status,
)
from execgate.client import wire as client_wire
from execgate.client.loop.states import Machine, State, Transition
from execgate.v1 import runs_pb2 as rpb
from execgate.v1 import runs_pb2_grpc as rpb_grpc
from tests.daemon import Daemon
from tests.loop_support import (
    TOKENS,
    Background,
    as_,
    assert_continuous,
    edges,
    processes,
    start_auth_daemon,
    stop,
)
from tests.support import Streamer, wait_until

# Runs on each journal store: SQLite, and PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.journals, pytest.mark.usefixtures("journal_store")]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, journal_store: str) -> Iterator[Daemon]:
    """The module's daemon, on the journal store of this round (journal_store)."""
    d = start_auth_daemon(tmp_path_factory.mktemp("runs"))
    yield d
    stop(d)


@pytest.fixture(scope="module")
def bot(daemon: Daemon) -> Iterator[Client]:
    with as_(daemon, "bot") as c:
        yield c


@pytest.fixture(scope="module")
def bob(daemon: Daemon) -> Iterator[Client]:
    with as_(daemon, "bob") as c:
        yield c


def opened(client: Client, goal: str = "a goal") -> tuple[str, Machine]:
    """A new run and the machine that writes its events."""
    info = client.runs.start(goal)
    return info.run_id, Machine(info.run_id)


def moved_to_tools(client: Client, run_id: str, machine: Machine) -> None:
    """created -> requesting_model -> validating -> running_tools, appended."""
    client.runs.append(
        run_id,
        [
            machine.advance(State.REQUESTING_MODEL, "run started"),
            machine.advance(State.VALIDATING, "model replied", {"turn": {"calls": []}}),
            machine.advance(State.RUNNING_TOOLS, "1 call(s) sent"),
        ],
    )


def raw_append(daemon: Daemon, who: str, run_id: str, *events: rpb.RunEvent) -> rpb.Run:
    """AppendEvents with hand-made messages (what a client in another language may send)."""
    with grpc.insecure_channel(daemon.address) as channel:
        stub = rpb_grpc.RunsStub(channel)
        request = rpb.AppendEventsRequest(run_id=run_id, events=list(events))
        try:
            return stub.AppendEvents(
                request, metadata=(("authorization", f"Bearer {TOKENS[who]}"),)
            )
        except grpc.RpcError as exc:
            raise client_wire.translate(exc, daemon.address, run_id=run_id, run_op=True) from exc


def sleep_call(call_id: str, seconds: str = "30") -> Call:
    return Call(tool="run_command", arguments={"argv": ["sleep", seconds]}, call_id=call_id)


# ---------------------------------------------------------------- StartRun


def test_start_records_the_run_and_its_owner_is_the_caller(bot: Client) -> None:
    info = bot.runs.start(
        "count the lines",
        limits={"max_steps": 7, "max_cost": 0.5, "deadline_seconds": 30.0},
        model="scripted",
        config_version="cfg-3",
        labels={"client": "test"},
    )
    assert info.run_id.startswith("run_")
    assert info.owner == "bot"
    assert (info.state, info.terminal, info.last_seq, info.cancel) == (
        State.CREATED,
        False,
        0,
        None,
    )
    assert info.limits == {"max_steps": 7, "max_cost": 0.5, "deadline_seconds": 30.0}
    assert (info.goal, info.model, info.config_version) == ("count the lines", "scripted", "cfg-3")
    assert info.labels == {"client": "test"}
    assert info.created_at == pytest.approx(time.time(), abs=30)
    detail = bot.runs.get(info.run_id)
    assert detail.run == info
    assert detail.events == ()
    assert detail.calls == ()


def test_a_chosen_run_id_is_kept_and_cannot_be_taken_twice(bot: Client, bob: Client) -> None:
    info = bot.runs.start("mine", run_id="chosen-run-1")
    assert info.run_id == "chosen-run-1"
    with pytest.raises(RunRefused) as refused:
        bob.runs.start("theirs", run_id="chosen-run-1")
    assert refused.value.kind == "exists"
    # The first run is untouched: still bot's, still its goal.
    run = bot.runs.get("chosen-run-1").run
    assert (run.owner, run.goal) == ("bot", "mine")


def test_an_oversized_goal_is_refused_as_malformed(bot: Client) -> None:
    with pytest.raises(RunRefused) as refused:
        bot.runs.start("g" * (64 * 1024 + 1), run_id="too-big-goal")
    assert refused.value.kind == "malformed"
    with pytest.raises(RunNotFound):
        bot.runs.get("too-big-goal")


def test_unknown_run_is_run_not_found_everywhere(bot: Client) -> None:
    m = Machine("no-such-run")
    for attempt in (
        lambda: bot.runs.get("no-such-run"),
        lambda: bot.runs.append("no-such-run", [m.advance(State.REQUESTING_MODEL, "x")]),
        lambda: bot.runs.cancel("no-such-run"),
        lambda: list(bot.runs.watch("no-such-run")),
    ):
        with pytest.raises(RunNotFound) as missing:
            attempt()
        assert missing.value.run_id == "no-such-run"


# ---------------------------------------------------------------- AppendEvents


def test_appended_events_come_back_in_order_with_their_data(bot: Client) -> None:
    run_id, m = opened(bot)
    first = [
        m.advance(State.REQUESTING_MODEL, "run started"),
        m.advance(State.VALIDATING, "model replied", {"turn": {"text": "hi", "calls": []}}),
    ]
    after = bot.runs.append(run_id, first)
    assert (after.state, after.last_seq, after.reason, after.terminal) == (
        State.VALIDATING,
        2,
        "model replied",
        False,
    )
    done = m.advance(State.COMPLETED, "final answer accepted", {"answer": "hi", "n": [1, 2]})
    after = bot.runs.append(run_id, [done])
    assert (after.state, after.last_seq, after.terminal) == (State.COMPLETED, 3, True)

    events = bot.runs.get(run_id).events
    assert_continuous(run_id, events)
    sent = [*first, done]
    assert [(e.seq, e.from_state, e.to_state, e.reason, e.data) for e in events] == [
        (e.seq, e.from_state, e.to_state, e.reason, e.data) for e in sent
    ]
    # The client's timestamps are kept (to the microsecond).
    for got, want in zip(events, sent, strict=True):
        assert got.at == pytest.approx(want.at, abs=1e-6)


# A legal next state from each state these tests leave a run in.
_NEXT = {State.VALIDATING: State.RUNNING_TOOLS, State.RUNNING_TOOLS: State.REQUESTING_MODEL}
KINDS = ["gap", "duplicate", "discontinuous", "illegal", "malformed"]


def broken_after(prev: Transition, kind: str) -> Transition:
    """An event that would continue `prev`, but for one fault of the given kind."""
    ok = Transition(
        prev.run_id, prev.seq + 1, time.time(), prev.to_state, _NEXT[prev.to_state], "next"
    )
    match kind:
        case "gap":
            return dataclasses.replace(ok, seq=prev.seq + 2)
        case "duplicate":
            return dataclasses.replace(ok, seq=prev.seq)
        case "discontinuous":
            return dataclasses.replace(ok, from_state=State.CREATED)
        case "illegal":
            return dataclasses.replace(ok, to_state=State.CREATED)  # nothing leads back
        case "malformed":
            return dataclasses.replace(ok, data={"blob": "x" * (1 << 20)})  # over 1 MiB
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_an_append_that_breaks_the_history_is_refused_and_nothing_is_kept(
    bot: Client, kind: str
) -> None:
    run_id, m = opened(bot)
    replied = [m.advance(State.REQUESTING_MODEL, "run started"), m.advance(State.VALIDATING, "r")]
    bot.runs.append(run_id, replied)
    before = bot.runs.get(run_id)
    with pytest.raises(RunRefused) as refused:
        bot.runs.append(run_id, [broken_after(replied[-1], kind)])
    assert refused.value.kind == kind
    assert refused.value.run_id == run_id
    after = bot.runs.get(run_id)
    assert after.events == before.events
    assert (after.run.state, after.run.last_seq) == (State.VALIDATING, 2)
    # The run still takes the event that does continue it.
    bot.runs.append(run_id, [m.advance(State.RUNNING_TOOLS, "1 call(s) sent")])
    assert bot.runs.get(run_id).run.last_seq == 3


@pytest.mark.parametrize("good_before", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_a_multi_event_append_is_all_or_nothing(bot: Client, kind: str, good_before: int) -> None:
    """Good events before a bad one in the same request are not kept either."""
    run_id, m = opened(bot)
    bot.runs.append(run_id, [m.advance(State.REQUESTING_MODEL, "run started")])
    good = [m.advance(State.VALIDATING, "model replied"), m.advance(State.RUNNING_TOOLS, "sent")]
    batch = [*good[:good_before], broken_after(good[good_before - 1], kind)]
    with pytest.raises(RunRefused) as refused:
        bot.runs.append(run_id, batch)
    assert refused.value.kind == kind
    detail = bot.runs.get(run_id)
    assert [e.seq for e in detail.events] == [1]
    assert (detail.run.state, detail.run.last_seq) == (State.REQUESTING_MODEL, 1)
    # The daemon's view of the run did not move either: the good events alone fit.
    assert bot.runs.append(run_id, good).last_seq == 3


def _event(seq: int, src: str, dst: str, data_json: str = "{}") -> rpb.RunEvent:
    return rpb.RunEvent(seq=seq, from_state=src, to_state=dst, reason="r", data_json=data_json)


@pytest.mark.parametrize(
    ("data_json", "src", "dst"),
    [
        ("{not json", "validating", "running_tools"),
        ("[1, 2]", "validating", "running_tools"),
        ('"text"', "validating", "running_tools"),
        ("{}", "validating", "thinking"),
        ("{}", "", "running_tools"),
    ],
    ids=["not-json", "array", "string", "unknown-state", "no-state"],
)
def test_malformed_events_are_refused_whole(
    daemon: Daemon, bot: Client, data_json: str, src: str, dst: str
) -> None:
    """What only a hand-made (or other-language) client can send: refused as malformed,
    and the good event before it in the same request is not kept."""
    run_id, m = opened(bot)
    bot.runs.append(run_id, [m.advance(State.REQUESTING_MODEL, "run started")])
    good = _event(2, "requesting_model", "validating", data_json='{"turn": {}}')
    with pytest.raises(RunRefused) as refused:
        raw_append(daemon, "bot", run_id, good, _event(3, src, dst, data_json))
    assert refused.value.kind == "malformed"
    assert [e.seq for e in bot.runs.get(run_id).events] == [1]
    # The same good event is taken with a well-formed one; an empty data_json means {}.
    raw_append(daemon, "bot", run_id, good, _event(3, "validating", "running_tools", ""))
    events = bot.runs.get(run_id).events
    assert [e.seq for e in events] == [1, 2, 3]
    assert (events[1].data, events[2].data) == ({"turn": {}}, {})


def test_nothing_is_appended_after_a_terminal_state(bot: Client) -> None:
    run_id, m = opened(bot)
    bot.runs.append(
        run_id,
        [m.advance(State.REQUESTING_MODEL, "run started"), m.advance(State.EXPIRED, "deadline")],
    )
    nxt = m.next_seq
    for attempt in (
        # What would follow, were it not over; a stop on top of a stop; an empty append.
        [Transition(run_id, nxt, time.time(), State.EXPIRED, State.REQUESTING_MODEL, "again")],
        [Transition(run_id, nxt, time.time(), State.EXPIRED, State.FAILED, "again")],
        [],
    ):
        with pytest.raises(RunRefused) as refused:
            bot.runs.append(run_id, attempt)
        assert refused.value.kind == "ended"
    detail = bot.runs.get(run_id)
    assert (detail.run.state, detail.run.last_seq, detail.run.terminal) == (
        State.EXPIRED,
        2,
        True,
    )


def test_concurrent_appends_of_the_same_seq_keep_exactly_one(daemon: Daemon) -> None:
    """Two writers racing for one seq (say, a loop and its resumed copy): one wins."""
    with as_(daemon, "bot") as c:
        run_id, m = opened(c)
        c.runs.append(run_id, [m.advance(State.REQUESTING_MODEL, "run started")])
    gate = threading.Barrier(6)

    def append(i: int) -> str:
        moved = Transition(
            run_id, 2, time.time(), State.REQUESTING_MODEL, State.VALIDATING, f"writer {i}"
        )
        with as_(daemon, "bot") as c:
            gate.wait(timeout=10)
            try:
                c.runs.append(run_id, [moved])
            except RunRefused as exc:
                return str(exc.kind)
        return "appended"

    writers = [Background(functools.partial(append, i)) for i in range(6)]
    ends = sorted(w.result() for w in writers)
    assert ends == ["appended"] + ["duplicate"] * 5
    with as_(daemon, "bot") as c:
        events = c.runs.get(run_id).events
    assert [e.seq for e in events] == [1, 2]


def test_only_the_owner_appends(bot: Client, bob: Client, daemon: Daemon) -> None:
    run_id, m = opened(bot)
    with as_(daemon, "root") as root, pytest.raises(PermissionDenied):
        root.runs.append(run_id, [Machine(run_id).advance(State.REQUESTING_MODEL, "mine now")])
    with pytest.raises(PermissionDenied):
        bob.runs.append(run_id, [Machine(run_id).advance(State.REQUESTING_MODEL, "mine now")])
    assert bot.runs.get(run_id).events == ()
    bot.runs.append(run_id, [m.advance(State.REQUESTING_MODEL, "run started")])
    assert bot.runs.get(run_id).run.last_seq == 1


def test_a_run_id_with_another_agents_calls_cannot_be_started(bot: Client, bob: Client) -> None:
    """Else bob could claim bot's run id, shut bot's calls out and cancel them."""
    (mine,) = bot.execute([Call(tool="list_dir", arguments={"path": "."})], run_id="bots-job")
    assert mine.status is Status.SUCCESS
    with pytest.raises(PermissionDenied) as refused:
        bob.runs.start("take it", run_id="bots-job")
    assert "bot" in str(refused.value)
    with pytest.raises(PermissionDenied):
        bob.runs.start("the shared one", run_id="default")
    assert bot.runs.start("mine after all", run_id="bots-job").owner == "bot"


def test_only_the_owners_calls_join_a_started_run(bot: Client, bob: Client) -> None:
    run_id, _ = opened(bot)
    call = Call(tool="list_dir", arguments={"path": "."})
    (theirs,) = bob.execute([call], run_id=run_id)
    assert (theirs.status, theirs.error_class, theirs.field) == (
        Status.REJECTED,
        "permission_denied",
        "run_id",
    )
    assert "bot" in theirs.message
    (mine,) = bot.execute([call], run_id=run_id)
    assert mine.status is Status.SUCCESS
    # The refusal is on record too, and nothing of bob's ran in bot's run.
    by_agent = {(c.agent, c.outcome.status) for c in bot.runs.get(run_id).calls if c.outcome}
    assert by_agent == {("bob", Status.REJECTED), ("bot", Status.SUCCESS)}


# ---------------------------------------------------------------- GetRun and ListRuns


def test_get_run_has_the_runs_calls_oldest_first_and_only_them(bot: Client) -> None:
    run_id, _ = opened(bot)
    other_id, _ = opened(bot)
    first = bot.execute(
        [Call(tool="list_dir", arguments={"path": "."}, call_id="c1")], run_id=run_id
    )
    bot.execute([Call(tool="list_dir", arguments={"path": "."}, call_id="c9")], run_id=other_id)
    second = bot.execute(
        [Call(tool="read_file", arguments={"path": "missing.txt"}, call_id="c2")], run_id=run_id
    )
    calls = bot.runs.get(run_id).calls
    assert [(c.call_id, c.run_id, c.tool) for c in calls] == [
        ("c1", run_id, "list_dir"),
        ("c2", run_id, "read_file"),
    ]
    assert calls[0].outcome is not None
    assert calls[0].outcome.status is first[0].status is Status.SUCCESS
    assert calls[1].outcome is not None
    assert (calls[1].outcome.status, calls[1].outcome.error_class) == (
        second[0].status,
        second[0].error_class,
    )
    assert calls[0].agent == "bot"


def test_list_runs_filters_by_state_and_owner_newest_first(bot: Client, bob: Client) -> None:
    live_id, m = opened(bot, "live one")
    ended_id, e = opened(bot, "ended one")
    bot.runs.append(
        ended_id,
        [e.advance(State.REQUESTING_MODEL, "go"), e.advance(State.FAILED, "model_error")],
    )
    bobs_id, _ = opened(bob, "bob's")
    bot.runs.append(live_id, [m.advance(State.REQUESTING_MODEL, "go")])

    active = {r.run_id: r for r in bot.runs.find(states=["active"])}
    assert live_id in active
    assert bobs_id not in active  # an agent lists its own runs (scope.py)
    assert ended_id not in active
    assert all(not r.terminal for r in active.values())
    assert active[live_id].state is State.REQUESTING_MODEL
    assert bobs_id in {r.run_id for r in bob.runs.find(states=["active"])}

    assert bob.runs.find(owner="bot") == []
    bots = bot.runs.find(owner="bot")
    assert {r.owner for r in bots} == {"bot"}
    assert {live_id, ended_id} <= {r.run_id for r in bots}
    created = [r.created_at for r in bots]
    assert created == sorted(created, reverse=True)

    failed = [r.run_id for r in bot.runs.find(states=["failed"], owner="bot")]
    assert ended_id in failed
    assert live_id not in failed
    assert bot.runs.find(owner="bob", states=["active"]) == []
    bobs = bob.runs.find(owner="bob", states=["active"])
    assert bobs_id in {r.run_id for r in bobs}
    assert {r.owner for r in bobs} == {"bob"}
    assert len(bot.runs.find(limit=2)) == 2


# ---------------------------------------------------------------- CancelRun


@pytest.mark.parametrize("who", ["bot", "olga", "root"])
def test_the_owner_an_operator_or_an_admin_may_cancel(
    daemon: Daemon, bot: Client, who: str
) -> None:
    run_id, m = opened(bot)
    bot.runs.append(run_id, [m.advance(State.REQUESTING_MODEL, "go")])
    before = time.time()
    with as_(daemon, who) as canceller:
        run = canceller.runs.cancel(run_id, reason="enough")
    assert run.cancel is not None
    assert (run.cancel.requester, run.cancel.reason) == (who, "enough")
    assert before - 1 <= run.cancel.at <= time.time() + 1
    # Recorded; the run itself moves only when its loop appends the terminal event.
    assert (run.state, run.terminal) == (State.REQUESTING_MODEL, False)
    assert bot.runs.get(run_id).run.cancel == run.cancel
    # The loop learns of it from its next append's reply.
    assert bot.runs.append(run_id, [m.advance(State.VALIDATING, "replied")]).cancel == run.cancel


def test_another_agent_may_not_cancel(bot: Client, bob: Client) -> None:
    run_id, _ = opened(bot)
    with pytest.raises(PermissionDenied):
        bob.runs.cancel(run_id, reason="not yours")
    assert bot.runs.get(run_id).run.cancel is None
    # Nor did it bar the run's calls.
    [ok] = bot.execute([Call(tool="list_dir", arguments={"path": "."})], run_id=run_id)
    assert ok.status is Status.SUCCESS


def test_the_first_cancel_request_stands(daemon: Daemon, bot: Client) -> None:
    run_id, _ = opened(bot)
    first = bot.runs.cancel(run_id, reason="first").cancel
    with as_(daemon, "root") as root:
        again = root.runs.cancel(run_id, reason="second").cancel
    assert first is not None
    assert again == first


def test_cancel_stops_running_calls_and_rejects_queued_and_later_ones(
    daemon: Daemon, bot: Client
) -> None:
    run_id, m = opened(bot)
    moved_to_tools(bot, run_id, m)
    # Both run_command calls claim the whole workspace: the second waits for the first.
    stream = Streamer(
        daemon.address,
        [sleep_call("running", "30"), sleep_call("queued", "29")],
        token=TOKENS["bot"],
        run_id=run_id,
    )
    wait_until(lambda: processes(["sleep", "30"], daemon.workspace), "the first call sleeping")
    wait_until(lambda: stream.seen(EventKind.WAITING, "queued"), "the second call waiting")
    asked = time.time()
    cancelled = bot.runs.cancel(run_id, reason="operator said stop")
    stream.join()
    assert stream.error is None, stream.error

    running = stream.outcome("running")
    requested, stopped = running.mark("cancel_requested"), running.mark("stopped")
    assert requested is not None
    assert stopped is not None
    assert running.status is not Status.SUCCESS
    assert running.error_class == "cancelled"
    # The call's stop is dated from the run's cancel request, and ended after it.
    assert cancelled.cancel is not None
    assert asked <= cancelled.cancel.at
    assert requested.at == pytest.approx(cancelled.cancel.at, abs=1e-3)
    assert requested.at <= stopped.at
    assert not processes(["sleep", "30"], daemon.workspace)

    queued = stream.outcome("queued")
    assert (queued.status, queued.error_class) == (Status.REJECTED, "cancelled")
    assert queued.mark("started") is None

    [later] = bot.execute([Call(tool="list_dir", arguments={"path": "."})], run_id=run_id)
    assert (later.status, later.field) == (Status.REJECTED, "run_id")
    # The journal says the same as the stream did.
    calls = {c.call_id: c for c in bot.runs.get(run_id).calls}
    assert calls["running"].outcome is not None
    assert calls["running"].outcome.error_class == "cancelled"
    assert not calls["running"].running


def test_cancel_of_an_ended_run_records_nothing(bot: Client) -> None:
    run_id, m = opened(bot)
    bot.runs.append(
        run_id, [m.advance(State.REQUESTING_MODEL, "go"), m.advance(State.FAILED, "model_error")]
    )
    run = bot.runs.cancel(run_id, reason="too late")
    assert run.cancel is None
    assert run.state is State.FAILED


# ---------------------------------------------------------------- the Executor and ended runs


@pytest.mark.parametrize("end", [State.COMPLETED, State.CANCELLED, State.EXPIRED])
def test_tool_calls_of_an_ended_run_are_rejected_naming_run_id(
    daemon: Daemon, bot: Client, end: State
) -> None:
    run_id, m = opened(bot)
    via = State.VALIDATING if end is State.COMPLETED else State.REQUESTING_MODEL
    events = [m.advance(State.REQUESTING_MODEL, "go")]
    if via is State.VALIDATING:
        events.append(m.advance(State.VALIDATING, "replied"))
    events.append(m.advance(end, "over"))
    bot.runs.append(run_id, events)
    target = bot.execute(
        [Call(tool="write_file", arguments={"path": f"after-{end}.txt", "content": "x"})],
        run_id=run_id,
    )
    [outcome] = target
    assert outcome.status is Status.REJECTED
    assert outcome.field == "run_id"
    assert end.value in outcome.message
    assert outcome.mark("started") is None
    assert not (daemon.workspace / f"after-{end}.txt").exists()


# ---------------------------------------------------------------- WatchRun


def test_watch_streams_history_then_new_events_and_the_cancel_then_ends(
    daemon: Daemon, bot: Client
) -> None:
    run_id, m = opened(bot)
    bot.runs.append(run_id, [m.advance(State.REQUESTING_MODEL, "go")])
    seen: list[Transition | CancelNotice] = []

    def watch() -> list[Transition | CancelNotice]:
        with as_(daemon, "olga") as olga:  # an operator may watch anyone's run
            for update in olga.runs.watch(run_id):
                seen.append(update)
        return seen

    watcher = Background(watch)
    wait_until(lambda: len(seen) == 1, "the history")
    bot.runs.append(run_id, [m.advance(State.VALIDATING, "replied", {"turn": {"n": 1}})])
    wait_until(lambda: len(seen) == 2, "the new event")
    bot.runs.cancel(run_id, reason="halt")
    wait_until(lambda: len(seen) == 3, "the cancel notice")
    assert not watcher.done
    bot.runs.append(run_id, [m.advance(State.CANCELLED, "cancelled by bot: halt")])
    got = watcher.result(timeout=10)

    events = [u for u in got if isinstance(u, Transition)]
    notices = [u for u in got if isinstance(u, CancelNotice)]
    assert [(e.seq, e.to_state) for e in events] == [
        (1, State.REQUESTING_MODEL),
        (2, State.VALIDATING),
        (3, State.CANCELLED),
    ]
    assert events[1].data == {"turn": {"n": 1}}
    assert isinstance(got[2], CancelNotice)
    assert [(n.requester, n.reason) for n in notices] == [("bot", "halt")]


def test_watch_after_seq_and_of_an_ended_run(bot: Client) -> None:
    run_id, m = opened(bot)
    bot.runs.append(
        run_id,
        [
            m.advance(State.REQUESTING_MODEL, "go"),
            m.advance(State.VALIDATING, "replied"),
            m.advance(State.COMPLETED, "final answer accepted", {"answer": "42"}),
        ],
    )
    # An ended run's watch replays what is asked for and ends by itself.
    whole = Background(lambda: list(bot.runs.watch(run_id))).result(timeout=10)
    assert [u.seq for u in whole if isinstance(u, Transition)] == [1, 2, 3]
    tail = Background(lambda: list(bot.runs.watch(run_id, after_seq=2))).result(timeout=10)
    assert [(u.seq, u.data) for u in tail if isinstance(u, Transition)] == [(3, {"answer": "42"})]


def test_watch_of_a_run_cancelled_before_it_started_includes_the_cancel(bot: Client) -> None:
    run_id, m = opened(bot)
    bot.runs.append(run_id, [m.advance(State.REQUESTING_MODEL, "go")])
    bot.runs.cancel(run_id, reason="before anyone watched")
    seen: list[Transition | CancelNotice] = []

    def watch() -> list[Transition | CancelNotice]:
        for update in bot.runs.watch(run_id):
            seen.append(update)
        return seen

    watcher = Background(watch)
    wait_until(lambda: len(seen) == 2, "the history and the cancel")
    bot.runs.append(run_id, [m.advance(State.CANCELLED, "cancelled")])
    got = watcher.result(timeout=10)
    assert [type(u).__name__ for u in got] == ["Transition", "CancelNotice", "Transition"]
    notice = got[1]
    assert isinstance(notice, CancelNotice)
    assert notice.reason == "before anyone watched"


# ---------------------------------------------------------------- across a restart


def test_the_record_outlives_a_daemon_restart(tmp_path: Path) -> None:
    d = start_auth_daemon(tmp_path)
    try:
        with as_(d, "bot") as c:
            live_id, live = opened(c)
            c.runs.append(live_id, [live.advance(State.REQUESTING_MODEL, "go")])
            ended_id, ended = opened(c)
            c.runs.append(
                ended_id,
                [ended.advance(State.REQUESTING_MODEL, "go"), ended.advance(State.FAILED, "x")],
            )
            barred_id, _ = opened(c)
            c.runs.cancel(barred_id, reason="stop it")
        d.stop()
        d.restart()
        with as_(d, "bot") as c:
            # A live run continues from its last seq, checked against its replayed history.
            skip = Transition(live_id, 2, time.time(), live.state, State.COMPLETED, "skip")
            with pytest.raises(RunRefused) as refused:
                c.runs.append(live_id, [skip])
            assert refused.value.kind == "illegal"
            live = Machine.replay(live_id, c.runs.get(live_id).events)
            assert c.runs.append(live_id, [live.advance(State.VALIDATING, "r")]).last_seq == 2
            # An ended run stays ended: no events, no calls.
            more = Transition(ended_id, 3, time.time(), State.FAILED, State.REQUESTING_MODEL, "")
            with pytest.raises(RunRefused) as refused:
                c.runs.append(ended_id, [more])
            assert refused.value.kind == "ended"
            for run_id in (ended_id, barred_id):
                [out] = c.execute([Call(tool="list_dir", arguments={"path": "."})], run_id=run_id)
                assert (out.status, out.field) == (Status.REJECTED, "run_id")
            cancel = c.runs.get(barred_id).run.cancel
            assert cancel is not None
            assert (cancel.requester, cancel.reason) == ("bot", "stop it")
            assert edges(c.runs.get(live_id).events) == [
                ("created", "requesting_model"),
                ("requesting_model", "validating"),
            ]
    finally:
        stop(d)
