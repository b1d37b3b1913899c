"""Fairness between agents and the policy's per-agent quotas, through a real daemon.

Identities: `flood`, `quick`, `capped`, `limited`, `hasty` and `paced` are agents;
`olga` is an operator (she cancels what a test leaves queued). What is checked is
what the daemon reports -- grant order from the outcomes' `lock_granted` marks, the
values the `work` probe read, WAITING marks, refusals and their journal records --
never how long anything took, except that pacing makes calls at least so far apart.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import pytest

from execgate.client import Call, Client, EventKind, Outcome, Status
from execgate.executor.policy.identity import hash_token
from tests.cancel_support import work
from tests.daemon import Daemon, scaled
from tests.support import Streamer, wait_until

AGENTS = ("flood", "quick", "capped", "limited", "hasty", "paced")
TOKENS = {name: f"{name}-" + name[0] * 40 for name in (*AGENTS, "olga")}
IDENTITIES = "version: 1\nidentities:\n" + "".join(
    f"  - {{name: {name}, roles: [{'operator' if name == 'olga' else 'agent'}], "
    f"token_sha256: {hash_token(token)}}}\n"
    for name, token in TOKENS.items()
)
POLICY = """\
version: 1
default: deny
rules:
  - {id: all, effect: allow, tools: ['*']}
quotas:
  - {agents: [capped], concurrent: 2}
  - {agents: [limited], queued: 3}
  - {agents: [hasty], per_second: 0.05, over: reject}
  - {agents: [paced], per_second: 5, burst: 1}
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("fairness")
    (root / "identities.yaml").write_text(IDENTITIES)
    (root / "policy.yaml").write_text(POLICY)
    home = root / "daemon"
    home.mkdir()
    d = Daemon(
        home, "--identities", str(root / "identities.yaml"), "--policy", str(root / "policy.yaml")
    ).start()
    d.workspace.mkdir(exist_ok=True)
    yield d
    if d.proc is not None and d.proc.poll() is None:
        assert d.stop() == 0


def as_(d: Daemon, who: str) -> Client:
    return Client(d.address, token=TOKENS[who])


def new_run(who: str) -> str:
    return f"fair-{who}-{uuid.uuid4().hex[:10]}"


def granted(o: Outcome) -> float:
    found = o.mark("lock_granted")
    assert found is not None, (o.call_id, o.status, o.message, o.timeline)
    return found.at


def test_an_agent_flooding_a_file_does_not_starve_another_agents_read(daemon: Daemon) -> None:
    """flood proposes 40 increments of one file (each excludes the next); quick, once
    they all wait, reads that file. FIFO per conflict would put the read behind every
    increment still queued; the fair order lets it in after at most the two increments
    that stood first, and it reads exactly the increments granted before it."""
    (daemon.workspace / "shared.txt").write_text("0\n")
    run = new_run("flood")
    flood = [work(f"inc{i:02d}", "shared.txt", write=True, seconds=0.1) for i in range(40)]
    stream = Streamer(daemon.address, flood, token=TOKENS["flood"], run_id=run)
    waiting = lambda: sum(e.kind is EventKind.WAITING for e in list(stream.events))  # noqa: E731
    wait_until(lambda: waiting() == 39 or stream.error is not None, "the flood to queue")
    with as_(daemon, "quick") as c:
        read = c.run(work("read", "shared.txt", seconds=0), run_id=new_run("quick"))
    stream.join(scaled(60))
    assert stream.error is None, stream.error
    incs = [stream.outcome(f"inc{i:02d}") for i in range(40)]
    assert all(o.status is Status.SUCCESS for o in incs)
    # flood's own calls kept their order, each reading what the one before it wrote.
    assert [int(o.text.strip()) for o in incs] == list(range(40))
    assert sorted(incs, key=granted) == incs
    queued = read.mark("queued")
    assert read.status is Status.SUCCESS
    assert queued is not None
    still_queued = [o for o in incs if granted(o) > queued.at]
    overtaken_by = [o for o in still_queued if granted(o) < granted(read)]
    assert len(still_queued) >= 20, "the flood had run out before the read came"
    assert len(overtaken_by) <= 2, [o.call_id for o in overtaken_by]
    before = sum(granted(o) < granted(read) for o in incs)
    assert int(read.text.strip()) == before


def overlaps(outcomes: list[Outcome]) -> int:
    """The most of these calls that ran at one moment (from started/finished marks)."""
    edges = []
    for o in outcomes:
        start, end = o.mark("started"), o.mark("finished")
        assert start is not None, o
        assert end is not None, o
        edges += [(start.at, 1), (end.at, -1)]
    running = peak = 0
    for _, step in sorted(edges):  # an end before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


def test_a_concurrent_cap_holds_one_agents_calls_and_not_anothers(daemon: Daemon) -> None:
    """capped (concurrent: 2) sends six calls on six files: never more than two run at
    once, the others wait naming the limit; quick's call meanwhile waits for nothing."""
    for i in range(6):
        (daemon.workspace / f"cap{i}.txt").write_text("0\n")
    calls = [work(f"c{i}", f"cap{i}.txt", seconds=0.3) for i in range(6)]
    stream = Streamer(daemon.address, calls, token=TOKENS["capped"], run_id=new_run("capped"))
    wait_until(lambda: stream.seen(EventKind.STARTED, "c1"), "two capped calls to start")
    with as_(daemon, "quick") as c:
        other = c.run(work("free", "cap5.txt", seconds=0), run_id=new_run("quick"))
    stream.join(scaled(60))
    outcomes = [stream.outcome(f"c{i}") for i in range(6)]
    assert all(o.status is Status.SUCCESS for o in outcomes)
    assert overlaps(outcomes) <= 2
    waited = [m.detail for o in outcomes for m in o.timeline if m.phase == "waiting"]
    assert waited
    assert all("quotas[0].concurrent" in d for d in waited), waited
    assert other.status is Status.SUCCESS
    assert other.mark("waiting") is None


def test_calls_over_queued_are_rejected_naming_the_limit_and_journaled(daemon: Daemon) -> None:
    """limited (queued: 3) proposes six writes of one file: the first runs, three wait,
    the last two are REJECTED resource_exhausted naming quotas[1].queued, on the record."""
    (daemon.workspace / "limited.txt").write_text("0\n")
    run = new_run("limited")
    calls = [work(f"q{i}", "limited.txt", write=True, seconds=0) for i in range(6)]
    calls[0] = work("q0", "limited.txt", write=True, seconds=30)
    stream = Streamer(daemon.address, calls, token=TOKENS["limited"], run_id=run)
    wait_until(lambda: stream.seen(EventKind.FINISHED, "q5"), "the last call to be refused")
    for name in ("q4", "q5"):
        o = stream.outcome(name)
        assert (o.status, o.error_class, o.field) == (
            Status.REJECTED,
            "resource_exhausted",
            "quotas[1].queued",
        ), o
        assert "agent 'limited' has 3 calls waiting to start" in o.message
        with as_(daemon, "limited") as c:
            record = c.get_call(name, run_id=run)
        assert record.outcome is not None
        assert record.outcome.field == "quotas[1].queued"
    with as_(daemon, "olga") as c:
        c.cancel(run_id=run, reason="end of test")
    stream.join(scaled(30))
    assert [stream.outcome(f"q{i}").status for i in range(1, 4)] == [Status.REJECTED] * 3


def test_a_rate_with_reject_refuses_early_calls(daemon: Daemon) -> None:
    run = new_run("hasty")
    with as_(daemon, "hasty") as c:
        outcomes = c.execute(
            [Call(tool="noop", arguments={}, call_id=f"n{i}") for i in range(3)], run_id=run
        )
    assert [o.status for o in outcomes] == [Status.SUCCESS, Status.REJECTED, Status.REJECTED]
    for o in outcomes[1:]:
        assert (o.error_class, o.field) == ("resource_exhausted", "quotas[2].per_second")
        assert "faster than 0.05 per second" in o.message


def test_a_rate_with_wait_paces_the_calls_in_order(daemon: Daemon) -> None:
    """paced (5 per second, burst 1): each call joins the lock queue at least 0.2 s after
    the one before, in proposal order, and its timeline names the rate it waited for."""
    with as_(daemon, "paced") as c:
        outcomes = c.execute(
            [Call(tool="noop", arguments={}, call_id=f"p{i}") for i in range(4)],
            run_id=new_run("paced"),
        )
    assert all(o.status is Status.SUCCESS for o in outcomes)
    times = [granted(o) for o in outcomes]
    assert all(b - a >= 0.19 for a, b in itertools.pairwise(times)), times
    for o in outcomes[1:]:
        [mark] = [m for m in o.timeline if m.phase == "waiting"]
        assert mark.detail == "paced to 5 calls per second (quotas[3].per_second)"
