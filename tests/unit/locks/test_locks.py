"""Multi-granularity locks: keys, modes, plans, the grant rule, the in-process manager."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execgate.executor.locks import (
    Abandoned,
    BackendClosed,
    Claim,
    Key,
    LockBackend,
    LockManager,
    LockMode,
    WaitInfo,
    combine,
    compatible,
    explain,
    net_key,
    plan,
    plans_conflict,
    workspace_key,
)
from execgate.executor.locks import path_key as root_path_key
from execgate.executor.locks import table_key as root_table_key
from execgate.executor.locks.decide import Ask, LockTable, Turns, decide, entries
from execgate.executor.locks.keys import server_key
from execgate.executor.tools import Mode

IS, IX, S, SIX, X = LockMode.IS, LockMode.IX, LockMode.S, LockMode.SIX, LockMode.X
# The workspace most tests work in, and another one beside it.
ROOT, OTHER = "/w", "/v"
WS = Key(("ws", ROOT))


def path_key(rel: str) -> Key:
    return root_path_key(ROOT, rel)


def table_key(db: str, table: str) -> Key:
    return root_table_key(ROOT, db, table)


Plan = Mapping[Key, LockMode]


def R(*paths: str) -> dict[Key, LockMode]:
    return plan(Claim(path_key(p), Mode.READ) for p in paths)


def W(*paths: str) -> dict[Key, LockMode]:
    return plan(Claim(path_key(p), Mode.WRITE) for p in paths)


# ---------------------------------------------------------------- keys


def test_path_keys_form_the_workspace_tree() -> None:
    assert workspace_key(ROOT) == WS
    assert path_key(".") == path_key("") == WS
    assert path_key("a/b.txt") == Key(("ws", ROOT, "a", "b.txt"))
    # One file, one key, however the separators were written.
    for spelling in ("a//b.txt", "./a/b.txt", "a/./b.txt", "a/b.txt/"):
        assert path_key(spelling) == path_key("a/b.txt")


@pytest.mark.parametrize("bad", ["../a", "a/../b", "/etc/passwd", "a\x00b"])
def test_path_key_refuses_non_canonical_paths(bad: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        path_key(bad)


def test_table_and_net_keys() -> None:
    assert table_key("data/x.db", "t") == Key(("ws", ROOT, "data", "x.db", "\x00t"))
    # SQLite table names are case-insensitive: one table, one key.
    assert table_key("data/x.db", "Users") == table_key("data//x.db", "users")
    assert net_key("Example.COM") == Key(("net", "example.com"))
    assert net_key("example.com.") == net_key("example.com")
    # A table never collides with a file of the same name under a directory named like the db.
    assert table_key("d", "t") != path_key("d/t")
    with pytest.raises(ValueError, match="workspace"):
        table_key(".", "t")


def test_ancestors_and_descent() -> None:
    k = table_key("data/x.db", "t")
    # The `ws` node above the workspaces is never locked: no key names it.
    assert k.ancestors() == (WS, path_key("data"), path_key("data/x.db"))
    assert WS.ancestors() == ()
    assert net_key("h").ancestors() == (Key(("net",)),)
    assert WS.is_ancestor_of(k)
    assert path_key("data/x.db").is_ancestor_of(k)
    assert not k.is_ancestor_of(k)
    assert not path_key("dat").is_ancestor_of(k)
    assert not Key(("net",)).is_ancestor_of(WS)


def test_render() -> None:
    assert WS.render() == "workspace"
    assert path_key("a/b.txt").render() == "file:/w/a/b.txt"
    assert root_path_key(OTHER, "a/b.txt").render() == "file:/v/a/b.txt"
    assert table_key("data/x.db", "t").render() == "table:/w/data/x.db/t"
    assert net_key("example.com").render() == "net:example.com"
    assert server_key("git", ROOT).render() == "mcp:git"


def test_each_workspace_is_a_tree_of_its_own() -> None:
    """Keys name their workspace's canonical root: nothing in one workspace conflicts with
    anything in another, not even a command's X on the whole of each."""
    assert path_key("a").workspace == ROOT
    assert net_key("h").workspace == ""
    assert not plans_conflict(
        plan([Claim(workspace_key(ROOT), Mode.WRITE)]),
        plan([Claim(workspace_key(OTHER), Mode.WRITE)]),
    )
    assert not plans_conflict(W("a.txt"), plan([Claim(root_path_key(OTHER, "a.txt"), Mode.WRITE)]))
    assert plans_conflict(W("a.txt"), plan([Claim(workspace_key(ROOT), Mode.READ)]))
    # An MCP server's key is per workspace too (a process of its own in each).
    assert not plans_conflict(
        plan([Claim(server_key("git", ROOT), Mode.WRITE)]),
        plan([Claim(server_key("git", OTHER), Mode.WRITE)]),
    )
    with pytest.raises(ValueError, match="absolute"):
        workspace_key("relative/root")


def test_keys_order_root_first() -> None:
    keys = [path_key("b"), path_key("a/z"), WS, path_key("a")]
    assert sorted(keys) == [WS, path_key("a"), path_key("a/z"), path_key("b")]


# ---------------------------------------------------------------- modes

# The standard matrix, written out: row requested, column held.
MATRIX = {
    IS: {IS: True, IX: True, S: True, SIX: True, X: False},
    IX: {IS: True, IX: True, S: False, SIX: False, X: False},
    S: {IS: True, IX: False, S: True, SIX: False, X: False},
    SIX: {IS: True, IX: False, S: False, SIX: False, X: False},
    X: {IS: False, IX: False, S: False, SIX: False, X: False},
}


@pytest.mark.parametrize(("a", "b"), list(itertools.product(LockMode, LockMode)))
def test_compatibility_matrix(a: LockMode, b: LockMode) -> None:
    assert compatible(a, b) is MATRIX[a][b]
    # The bit masks the lock table uses agree with the matrix.
    assert bool(a.conflicts & b.unit) is not MATRIX[a][b]


COMBINED = {
    (IS, IS): IS,
    (IS, IX): IX,
    (IS, S): S,
    (IS, SIX): SIX,
    (IS, X): X,
    (IX, IX): IX,
    (IX, S): SIX,
    (IX, SIX): SIX,
    (IX, X): X,
    (S, S): S,
    (S, SIX): SIX,
    (S, X): X,
    (SIX, SIX): SIX,
    (SIX, X): X,
    (X, X): X,
}


@pytest.mark.parametrize(("a", "b"), list(COMBINED))
def test_combine_is_the_least_upper_bound(a: LockMode, b: LockMode) -> None:
    assert combine(a, b) is COMBINED[a, b]
    assert combine(b, a) is COMBINED[a, b]
    # The combined mode excludes at least what each part excludes.
    c = combine(a, b)
    for other in LockMode:
        if not compatible(a, other) or not compatible(b, other):
            assert not compatible(c, other)


# ---------------------------------------------------------------- plan


def test_plan_puts_intention_locks_on_ancestors() -> None:
    assert R("a/b.txt") == {WS: IS, path_key("a"): IS, path_key("a/b.txt"): S}
    assert W("a/b.txt") == {WS: IX, path_key("a"): IX, path_key("a/b.txt"): X}
    assert list(W("a/b.txt")) == [WS, path_key("a"), path_key("a/b.txt")]  # root first


def test_plan_combines_per_key() -> None:
    p = plan([Claim(path_key("d"), Mode.READ), Claim(path_key("d/f"), Mode.WRITE)])
    assert p == {WS: IX, path_key("d"): SIX, path_key("d/f"): X}
    assert plan([Claim(WS, Mode.WRITE)]) == {WS: X}
    assert plan([Claim(WS, Mode.WRITE), Claim(path_key("a"), Mode.READ)])[WS] is X
    t = table_key("x.db", "t")
    assert plan([Claim(t, Mode.WRITE), Claim(path_key("x.db"), Mode.READ)]) == {
        WS: IX,
        path_key("x.db"): SIX,
        t: X,
    }
    assert plan([]) == {}


def test_plans_conflict_through_the_hierarchy() -> None:
    assert not plans_conflict(R("a"), R("a"))
    assert not plans_conflict(W("a"), W("b"))
    assert not plans_conflict(W("d/a"), R("d/b"))
    assert plans_conflict(W("d"), R("d/a"))  # S/X on d meets IS/IX on d
    assert plans_conflict(R("d"), W("d/a"))
    assert plans_conflict(plan([Claim(WS, Mode.WRITE)]), R("anything"))
    assert not plans_conflict(
        plan([Claim(WS, Mode.WRITE)]), plan([Claim(net_key("h"), Mode.WRITE)])
    )
    tbl = table_key("x.db", "t")
    assert plans_conflict(plan([Claim(tbl, Mode.WRITE)]), W("x.db"))
    assert not plans_conflict(
        plan([Claim(tbl, Mode.WRITE)]), plan([Claim(table_key("x.db", "u"), Mode.WRITE)])
    )


# ---------------------------------------------------------------- the grant rule


def test_lock_table_counts_and_empties() -> None:
    table = LockTable()
    table.add(entries(R("a")))
    table.add(entries(R("a")))
    table.add(entries(W("a/b")))
    assert table.modes(path_key("a")) == {S, IX}
    assert table.modes(WS) == {IS, IX}
    assert table.conflicts(entries(W("a")))
    table.remove(entries(R("a")))
    table.remove(entries(W("a/b")))
    assert table.conflicts(entries(W("a")))  # one reader is left
    assert not table.conflicts(entries(R("a/c")))
    table.remove(entries(R("a")))
    assert not table  # invariant: nothing held means no key at all
    assert not table.conflicts(entries(W("a")))


def test_decide_is_fifo_per_conflict() -> None:
    held = LockTable([entries(R("f"))])
    queue = [
        (name, Ask(entries(p)))
        for name, p in [("w1", W("f")), ("r2", R("f")), ("w3", W("g")), ("r4", R("g"))]
    ]
    # w1 waits for the reader; r2 waits for w1 although it could share with the
    # reader; w3 overtakes both; r4 waits for w3 which was granted in the same pass.
    running: dict[str, int] = {}
    assert decide(held, running, queue) == ["w3"]
    assert held.conflicts(entries(R("g")))
    assert running == {"": 1}


def test_decide_keeps_a_capped_waiter_in_the_way_of_later_conflicts() -> None:
    """A waiter at its flow's cap is not granted and, like one waiting for a lock,
    blocks every later waiter it conflicts with; other flows go on."""
    held = LockTable()
    running = {"a": 2}
    queue = [
        ("a3", Ask(entries(W("f")), "a", 2)),  # a holds 2 already: waits for its cap
        ("b1", Ask(entries(R("f")), "b", 2)),  # conflicts with a3, which is ahead
        ("b2", Ask(entries(R("g")), "b", 2)),  # free
        ("b3", Ask(entries(R("h")), "b", 2)),  # b's cap: 2, b2 took one, this is the second
        ("b4", Ask(entries(R("i")), "b", 2)),  # b is at its cap now
    ]
    assert decide(held, running, queue) == ["b2", "b3"]
    assert running == {"a": 2, "b": 2}


def test_turns_interleave_flows_and_keep_each_flows_order() -> None:
    turns = Turns()
    tags = []
    smallest = 0
    for flow in ["a"] * 5 + ["b", "b", "c"]:
        tag = turns.next_tag(flow, smallest)
        turns.join(flow, tag)
        smallest = smallest or tag
        tags.append((flow, tag))
    # a's five calls take tags 1..5; b, arriving later, starts at 2 (one more than
    # the smallest waiting tag), then 3; c at 2: each flow's first call is near the
    # front, each flow's calls stay in order.
    assert tags == [("a", 1), ("a", 2), ("a", 3), ("a", 4), ("a", 5), ("b", 2), ("b", 3), ("c", 2)]
    for _ in range(5):
        turns.leave("a")
    assert turns.next_tag("a", 2) == 3  # a has no waiter left: it starts afresh


def test_explain_lists_direct_conflicts_in_proposal_order() -> None:
    batch = [("w1", W("d/a")), ("r2", R("d/a")), ("r3", R("d/b")), ("w4", W("d")), ("w5", W("e"))]
    assert explain(batch) == [
        ("w1", ()),
        ("r2", ("w1",)),
        ("r3", ()),
        ("w4", ("w1", "r2", "r3")),
        ("w5", ()),
    ]


# ---------------------------------------------------------------- the manager


async def settle(rounds: int = 20) -> None:
    """Let every task that can make progress do so (no wall-clock waiting)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class Holder:
    """A task that takes a plan, reports when it holds it, and keeps it until told."""

    def __init__(
        self,
        mgr: LockManager,
        owner: str,
        p: Plan,
        log: list[str],
        cancel: asyncio.Event | None = None,
        on_wait: Callable[[WaitInfo], None] | None = None,
        flow: str = "",
        cap: int = 0,
    ) -> None:
        self.owner = owner
        self.granted = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.create_task(self._run(mgr, p, log, cancel, on_wait, (flow, cap)))

    async def _run(
        self,
        mgr: LockManager,
        p: Plan,
        log: list[str],
        cancel: asyncio.Event | None,
        on_wait: Callable[[WaitInfo], None] | None,
        turn: tuple[str, int],
    ) -> None:
        flow, cap = turn
        lease = await mgr.acquire(self.owner, p, cancel=cancel, on_wait=on_wait, flow=flow, cap=cap)
        async with lease:
            log.append(f"+{self.owner}")
            self.granted.set()
            await self.release.wait()
            log.append(f"-{self.owner}")

    async def done(self) -> None:
        self.release.set()
        await self.task


def run_async(fn: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(fn(), timeout=10)

    asyncio.run(bounded())


def assert_empty(mgr: LockManager) -> None:
    snap = mgr.snapshot()
    assert snap.holders == ()
    assert snap.waiters == ()
    assert not mgr._held  # the tables' invariants: unions of nothing are empty
    assert not mgr._waiting
    assert not mgr._running
    assert not mgr._turns._flows


def test_uncontended_acquire_does_not_suspend() -> None:
    """The fast path returns from the coroutine's first step: no future, no task."""

    async def body() -> None:
        mgr = LockManager()
        coro = mgr.acquire("c1", W("a"))
        with pytest.raises(StopIteration) as stop:
            coro.send(None)
        lease = stop.value.value
        assert lease.owner == "c1"
        assert not lease.released
        lease.release()
        lease.release()  # idempotent
        assert lease.released
        assert_empty(mgr)

    run_async(body)


def test_readers_and_writers_of_different_files_run_together() -> None:
    async def body() -> None:
        mgr, log = LockManager(), list[str]()
        hs = [
            Holder(mgr, "r1", R("a"), log),
            Holder(mgr, "r2", R("b"), log),
            Holder(mgr, "r3", R("a"), log),
            Holder(mgr, "w4", W("c"), log),
            Holder(mgr, "w5", W("d/e"), log),
        ]
        await settle()
        assert all(h.granted.is_set() for h in hs)
        for h in hs:
            await h.done()
        assert_empty(mgr)

    run_async(body)


def test_directory_write_waits_for_readers_below_and_blocks_later_ones() -> None:
    async def body() -> None:
        mgr, log = LockManager(), list[str]()
        r1 = Holder(mgr, "r1", R("dir/a"), log)
        await settle()
        w = Holder(mgr, "w", W("dir"), log)
        await settle()
        assert not w.granted.is_set()
        r2 = Holder(mgr, "r2", R("dir/a"), log)  # queued after the writer
        other = Holder(mgr, "other", R("elsewhere"), log)
        await settle()
        assert not r2.granted.is_set()
        assert other.granted.is_set()
        await r1.done()
        await settle()
        assert w.granted.is_set()
        assert not r2.granted.is_set()
        await w.done()
        await settle()
        assert r2.granted.is_set()
        await r2.done()
        await other.done()
        assert log.index("-w") < log.index("+r2")
        assert_empty(mgr)

    run_async(body)


def test_conflicting_calls_run_in_arrival_order_even_behind_a_waiter() -> None:
    async def body() -> None:
        mgr, log = LockManager(), list[str]()
        r0 = Holder(mgr, "r0", R("f"), log)
        await settle()
        w1 = Holder(mgr, "w1", W("f"), log)
        await settle()
        r2 = Holder(mgr, "r2", R("f"), log)  # compatible with r0, but w1 came first
        w3 = Holder(mgr, "w3", W("g"), log)  # conflicts with nobody: overtakes
        await settle()
        assert [h.granted.is_set() for h in (r0, w1, r2, w3)] == [True, False, False, True]
        snap = mgr.snapshot()
        assert [e.owner for e in snap.holders] == ["r0", "w3"]
        assert [e.owner for e in snap.waiters] == ["w1", "r2"]
        await r0.done()
        await settle()
        assert w1.granted.is_set()
        assert not r2.granted.is_set()
        await w1.done()
        await settle()
        assert r2.granted.is_set()
        await r2.done()
        await w3.done()
        assert_empty(mgr)

    run_async(body)


def test_an_agent_flooding_the_queue_does_not_starve_another() -> None:
    """Agent a queues 30 calls that each exclude everything; agent b's read, proposed
    after them, waits for the one a holds and two more of a's (fair order: one more
    than the smallest waiting tag), not for all 30 (FIFO)."""

    async def body() -> None:
        mgr, log = LockManager(), list[str]()
        flood = [Holder(mgr, f"a{i}", W("."), log, flow="a") for i in range(30)]
        await settle()
        quick = Holder(mgr, "b0", R("f"), log, flow="b")
        await settle()
        assert [e.owner for e in mgr.snapshot().waiters][:3] == ["a1", "a2", "b0"]
        for holder in flood:
            if quick.granted.is_set():
                break
            await holder.done()
            await settle()
        assert quick.granted.is_set()
        # Granted right after a0, a1 and a2 (tags 1, 2, 2: a2 came first), before a3.
        assert [e for e in log if e.startswith("+")] == ["+a0", "+a1", "+a2", "+b0"]
        await quick.done()
        for holder in flood:
            await holder.done()
        # Each agent's own calls kept their order.
        assert [e for e in log if e.startswith("+a")] == [f"+a{i}" for i in range(30)]
        assert_empty(mgr)

    run_async(body)


def test_a_new_agent_stands_ahead_of_the_later_calls_of_a_busy_one() -> None:
    """b's write of y conflicts with a's third queued call (x and y), but stands before
    it in fair order: it is granted at once, which FIFO would not allow."""

    async def body() -> None:
        mgr, log = LockManager(), list[str]()
        a = [Holder(mgr, f"a{i}", W("x"), log, flow="a") for i in range(3)]
        a.append(Holder(mgr, "a3", W("x", "y"), log, flow="a"))
        await settle()
        b = Holder(mgr, "b0", W("y"), log, flow="b")
        await settle()
        assert b.granted.is_set()
        assert [e.owner for e in mgr.snapshot().waiters] == ["a1", "a2", "a3"]
        for holder in (*a[:3], b, a[3]):
            await holder.done()
        assert [e for e in log if e.startswith("+")] == ["+a0", "+b0", "+a1", "+a2", "+a3"]
        assert_empty(mgr)

    run_async(body)


def test_a_cap_holds_the_agents_later_calls_and_lets_others_by() -> None:
    """cap=2: agent a's third call waits for one of its two to end, holding nothing;
    agent b's calls, conflicting with none held, go at once; the capped waiter says so."""

    async def body() -> None:
        mgr, log = LockManager(), list[str]()
        infos: list[WaitInfo] = []
        a = [
            Holder(mgr, f"a{i}", R(f"a{i}"), log, on_wait=infos.append, flow="a", cap=2)
            for i in range(4)
        ]
        await settle()
        b = Holder(mgr, "b0", W("b"), log, flow="b", cap=2)
        await settle()
        assert [h.granted.is_set() for h in a] == [True, True, False, False]
        assert b.granted.is_set()
        assert [i.capped for i in infos] == [2, 2]
        assert infos[0].keys == ()  # no lock in its way: only its cap
        await a[0].done()
        await settle()
        assert [h.granted.is_set() for h in a] == [True, True, True, False]
        for holder in (*a, b):
            await holder.done()
        assert_empty(mgr)

    run_async(body)


def test_whole_workspace_write_excludes_every_file_but_not_the_network() -> None:
    async def body() -> None:
        mgr, log = LockManager(), list[str]()
        everything = plan([Claim(WS, Mode.WRITE)])
        r = Holder(mgr, "r", R("deep/down/f"), log)
        await settle()
        w = Holder(mgr, "ws", everything, log)
        net = Holder(mgr, "net", plan([Claim(net_key("h"), Mode.WRITE)]), log)
        await settle()
        assert not w.granted.is_set()
        assert net.granted.is_set()
        await r.done()
        await settle()
        assert w.granted.is_set()
        await w.done()
        await net.done()
        assert_empty(mgr)

    run_async(body)


def test_abandoned_waiter_leaves_no_trace() -> None:
    async def body() -> None:
        mgr, log = LockManager(), list[str]()
        r1 = Holder(mgr, "r1", R("f"), log)
        await settle()
        give_up = asyncio.Event()
        w = Holder(mgr, "w", W("f"), log, cancel=give_up)
        await settle()
        r2 = Holder(mgr, "r2", R("f"), log)
        await settle()
        assert not r2.granted.is_set()
        give_up.set()
        with pytest.raises(Abandoned) as err:
            await w.task
        assert err.value.owner == "w"
        await settle()
        assert r2.granted.is_set()  # the writer is gone: r2 shares with r1 at once
        assert [e.owner for e in mgr.snapshot().waiters] == []
        await r1.done()
        await r2.done()
        assert "+w" not in log
        assert_empty(mgr)

    run_async(body)


def test_cancel_already_set_is_abandoned_at_once() -> None:
    async def body() -> None:
        mgr = LockManager()
        cancel = asyncio.Event()
        cancel.set()
        with pytest.raises(Abandoned):
            await mgr.acquire("c", R("f"), cancel=cancel)
        assert_empty(mgr)

    run_async(body)


def test_cancelled_waiting_task_leaves_no_trace() -> None:
    async def body() -> None:
        mgr, log = LockManager(), list[str]()
        w1 = Holder(mgr, "w1", W("f"), log)
        await settle()
        w2 = Holder(mgr, "w2", W("f"), log, cancel=asyncio.Event())
        r = Holder(mgr, "r", R("f"), log)
        await settle()
        w2.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w2.task
        await w1.done()
        await settle()
        assert r.granted.is_set()
        await r.done()
        assert log == ["+w1", "-w1", "+r", "-r"]
        assert_empty(mgr)

    run_async(body)


@pytest.mark.parametrize("with_cancel_event", [False, True])
def test_task_cancelled_just_after_its_grant_does_not_leak_it(with_cancel_event: bool) -> None:
    async def body() -> None:
        mgr = LockManager()
        first = await mgr.acquire("first", W("f"))
        cancel = asyncio.Event() if with_cancel_event else None
        waiter = asyncio.create_task(mgr.acquire("second", W("f"), cancel=cancel))
        await settle()
        first.release()  # grants `second` (its future is resolved) ...
        assert [e.owner for e in mgr.snapshot().holders] == ["second"]
        waiter.cancel()  # ... but its task is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert_empty(mgr)

    run_async(body)


def test_on_wait_reports_conflicting_keys_and_blockers() -> None:
    async def body() -> None:
        mgr, log = LockManager(), list[str]()
        infos: list[WaitInfo] = []
        r1 = Holder(mgr, "r1", R("d/a"), log)
        r2 = Holder(mgr, "r2", R("d/b"), log)
        free = Holder(mgr, "free", R("e"), log, on_wait=infos.append)
        await settle()
        assert infos == []  # called only when the call has to wait
        w3 = Holder(mgr, "w3", W("d/a"), log)
        await settle()
        w4 = Holder(mgr, "w4", W("d"), log, on_wait=infos.append)
        await settle()
        assert infos == [WaitInfo(keys=(path_key("d"),), blockers=("r1", "r2", "w3"))]
        for h in (r1, r2, w3, w4, free):
            await h.done()
        assert len(infos) == 1  # once per call
        assert_empty(mgr)

    run_async(body)


def test_failing_on_wait_withdraws_the_waiter() -> None:
    def boom(info: WaitInfo) -> None:
        raise RuntimeError("observer failed")

    async def body() -> None:
        mgr = LockManager()
        lease = await mgr.acquire("a", W("f"))
        with pytest.raises(RuntimeError, match="observer"):
            await mgr.acquire("b", W("f"), on_wait=boom)
        lease.release()
        assert_empty(mgr)

    run_async(body)


def test_close_fails_waiters_and_refuses_new_calls() -> None:
    async def body() -> None:
        mgr = LockManager()
        lease = await mgr.acquire("a", W("f"))
        waiter = asyncio.create_task(mgr.acquire("b", W("f")))
        await settle()
        mgr.close()
        with pytest.raises(BackendClosed):
            await waiter
        with pytest.raises(BackendClosed):
            await mgr.acquire("c", W("g"))
        lease.release()  # leases stay valid after close
        assert_empty(mgr)

    run_async(body)


def test_the_plan_is_copied_at_acquire() -> None:
    async def body() -> None:
        mgr = LockManager()
        p = W("f")
        lease = await mgr.acquire("a", p)
        p.clear()  # the caller's mapping changing must not corrupt the table
        lease.release()
        assert_empty(mgr)

    run_async(body)


# ---------------------------------------------------------------- the rule, at random

PATHS = ["d", "d/a", "d/b", "e", "d/a/x"]
TABLES = [("t.db", "u"), ("t.db", "v")]
CLAIM_KEYS = [WS, *map(path_key, PATHS), path_key("t.db"), *(table_key(*t) for t in TABLES)]


@st.composite
def calls(draw: st.DrawFn) -> list[tuple[dict[Key, LockMode], int, float, str, str, int]]:
    """Calls as (plan, arrival gap in loop steps, seconds held, how it is interrupted,
    flow, cap)."""
    n = draw(st.integers(2, 9))
    # One cap per flow, as the policy gives one agent (a call's cap counts the grants
    # its flow holds, so calls of one flow with different caps would disagree).
    caps = {flow: draw(st.sampled_from([0, 0, 1, 2])) for flow in ("", "a", "b")}
    out = []
    for _ in range(n):
        claims = draw(
            st.lists(
                st.builds(Claim, st.sampled_from(CLAIM_KEYS), st.sampled_from(list(Mode))),
                min_size=1,
                max_size=2,
            )
        )
        gap = draw(st.integers(0, 3))
        hold = draw(st.sampled_from([0, 0, 0.0005, 0.001, 0.002]))
        stop = draw(st.sampled_from(["", "", "", "", "abandon", "cancel_task"]))
        flow = draw(st.sampled_from(["", "a", "b"]))
        out.append((plan(claims), gap, hold, stop, flow, caps[flow]))
    return out


def assert_settled(mgr: LockManager) -> None:
    """The manager's invariant: every waiter conflicts with a holder or a waiter ahead of
    it (fair order), or its flow holds as many grants as its cap."""
    snap = mgr.snapshot()
    held = [dict(e.plan) for e in snap.holders]
    for i, entry in enumerate(snap.waiters):
        mine = dict(entry.plan)
        ahead = [dict(e.plan) for e in snap.waiters[:i]]
        capped = entry.cap and sum(e.flow == entry.flow for e in snap.holders) >= entry.cap
        assert capped or any(plans_conflict(mine, other) for other in held + ahead), entry.owner


class Run:
    """Drives one random schedule and checks the rule at every grant."""

    def __init__(
        self,
        backends: Sequence[LockBackend],
        specs: list[Any],
        rng: random.Random,
        settled: Callable[[], None] | None = None,
    ) -> None:
        # Call i asks backends[i % len(backends)]: several "daemons" on one table.
        self.backends = backends
        self.settled = settled
        self.specs = specs
        self.rng = rng
        self.state: dict[int, str] = {}  # call -> waiting | holding | done | gave_up
        self.arrival: list[int] = []
        self.granted: list[int] = []

    def flow(self, i: int) -> tuple[int, str]:
        """A call's flow: its agent, on its daemon (a cap counts one daemon's grants)."""
        return i % len(self.backends), self.specs[i][4]

    async def call(self, i: int, cancel: asyncio.Event) -> None:
        p, _, hold, _, flow, cap = self.specs[i]
        self.arrival.append(i)
        self.state[i] = "waiting"
        try:
            backend = self.backends[i % len(self.backends)]
            lease = await backend.acquire(f"c{i}", p, cancel=cancel, flow=flow, cap=cap)
        except (Abandoned, asyncio.CancelledError):
            self.state[i] = "gave_up"
            raise
        async with lease:
            self.check_grant(i)
            self.state[i] = "holding"
            self.granted.append(i)
            try:
                await asyncio.sleep(hold)
            finally:
                self.state[i] = "done"  # the lease is released as the block ends

    def check_grant(self, i: int) -> None:
        p, cap = self.specs[i][0], self.specs[i][5]
        holding = [j for j, st_j in self.state.items() if st_j == "holding"]
        # (d) a flow never holds more grants than the cap its call carries
        if cap:
            mine = sum(self.flow(j) == self.flow(i) for j in holding)
            assert mine < cap, f"c{i} granted while its flow holds {mine} (cap {cap})"
        for j, st_j in self.state.items():
            if j == i or not plans_conflict(p, self.specs[j][0]):
                continue
            # (a) no two conflicting plans are held at once
            assert st_j != "holding", f"c{i} granted while conflicting c{j} holds"
            # (b) conflicting calls of one flow are granted in arrival order
            if self.flow(j) == self.flow(i) and self.arrival.index(j) < self.arrival.index(i):
                assert st_j != "waiting", f"c{i} overtook earlier conflicting c{j}"

    async def drive(self) -> None:
        tasks = []
        for i, (_, gap, _, stop, _, _) in enumerate(self.specs):
            for _ in range(gap):
                await asyncio.sleep(0)
            cancel = asyncio.Event()
            task = asyncio.create_task(self.call(i, cancel))
            tasks.append(task)
            if stop == "abandon":
                asyncio.get_running_loop().call_later(self.rng.random() * 0.002, cancel.set)
            elif stop == "cancel_task":
                asyncio.get_running_loop().call_later(self.rng.random() * 0.002, task.cancel)
        # (c) everything finishes: no deadlock
        watch = asyncio.gather(*tasks, return_exceptions=True)
        deadline = asyncio.get_running_loop().time() + 5
        while not watch.done():
            if self.settled is not None:  # grants are eager: the invariant holds at every step
                self.settled()
            assert asyncio.get_running_loop().time() < deadline, "calls did not finish"
            await asyncio.sleep(0)
        results = await watch
        for r in results:
            assert r is None or isinstance(r, Abandoned | asyncio.CancelledError), r


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=calls(), seed=st.integers(0, 2**32 - 1))
def test_random_schedules_keep_the_rule(specs: list[Any], seed: int) -> None:
    async def body() -> None:
        mgr = LockManager()
        run = Run([mgr], specs, random.Random(seed), settled=lambda: assert_settled(mgr))
        await run.drive()
        interrupted = {i for i, s in enumerate(specs) if s[3]}
        assert set(range(len(specs))) - interrupted <= set(run.granted)
        assert_empty(mgr)

    run_async(body)
