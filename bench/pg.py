"""Several daemons on one PostgreSQL, against the embedded default in the same run.

A throwaway PostgreSQL server (tests/pg_support.py: Debian's binaries, a cluster in a
temporary directory on a Unix socket, fsync on) and real daemons (tests/daemon.py):

  handoff    two daemons on PostgreSQL (`--journal postgresql://... --locks postgresql`):
             a `work` write of one file on daemon A, and while it runs a conflicting one
             on daemon B; the hand-off is B's LOCK_GRANTED mark minus A's FINISHED (A's
             release, its NOTIFY, B's grant pass). Alternating A and B. Baseline: the same
             on one daemon with in-process locks (both clients on it). Goal: p50 <= 10 ms.
  latency    sequential `Execute` round trips of the `noop` tool (a read-only call: its
             intent is not waited for) and of `write_file` (a writing call: its intent and
             outcome are durable), on a daemon with the SQLite journal and on one with the
             PostgreSQL journal (and in-process locks), then with PostgreSQL locks too.
  schedule   bench/schedule.py's random batches of `work` calls, spread over three daemons
             on PostgreSQL (call i to daemon i mod 3, each daemon's share as one
             ExecuteBatch, all three sent at once): makespan / critical path (measured run
             times, the DAG of conflicts in proposal order), lost updates (must be 0).
             Baseline: the whole batch as one ExecuteBatch on one embedded daemon. Goal:
             <= 1.15. Across daemons conflicting calls are granted in arrival order, not
             proposal order, so a ratio below 1 is possible.

Results also go to bench/results/pg.json. Exit status: breakage only, never a time.

    python bench/pg.py           # the full run
    python bench/pg.py --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/pg.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

from bench.dispatch import environment  # noqa: E402
from bench.schedule import (  # noqa: E402
    BenchError,
    Spec,
    check_ok,
    conflicts,
    counter_paths,
    critical_path,
    lost_updates,
    make_batch,
    make_calls,
    predecessors,
    prepare,
    read_counter,
)
from execgate.client import AsyncClient, Call, EventKind, Outcome, Status  # noqa: E402
from tests.daemon import Daemon  # noqa: E402
from tests.pg_support import PgServer  # noqa: E402

HANDOFF_GOAL_MS = 10.0
SCHEDULE_GOAL = 1.15
RESULTS = ROOT / "bench" / "results" / "pg.json"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def figures(xs: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(xs), "p95": pct(xs, 0.95), "n": len(xs)}


@contextlib.contextmanager
def started(daemons: list[Daemon]) -> Iterator[list[Daemon]]:
    try:
        for d in daemons:
            d.start()
        yield daemons
    finally:
        for d in daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()


def daemon(root: Path, name: str, *args: str, workspace: Path | None = None) -> Daemon:
    (root / name).mkdir()
    d = Daemon(root / name, "--sandbox", SANDBOX, *args)
    if workspace is not None:
        d.workspace = workspace
    return d


# bwrap: its commands (uid 0 without capabilities under a root daemon) may write the
# counters the bench makes, as bench/schedule.py's do.
SANDBOX = "bwrap"

# ------------------------------------------------------------------ hand-off


async def one_handoff(first: AsyncClient, second: AsyncClient, path: str, i: int) -> float:
    """ms from the first call's FINISHED to the second's LOCK_GRANTED."""
    hold = Call(tool="work", arguments={"path": path, "write": True, "seconds": 0.15})
    then = Call(tool="work", arguments={"path": path, "write": True, "seconds": 0})
    held: list[Outcome] = []

    async def holder(started: asyncio.Event) -> None:
        async for event in first.stream([hold], run_id=f"h{i}a"):
            if event.kind is EventKind.STARTED:
                started.set()
            if event.kind is EventKind.FINISHED and event.outcome is not None:
                held.append(event.outcome)

    running = asyncio.Event()
    task = asyncio.create_task(holder(running))
    await running.wait()
    (waited,) = await second.execute([then], run_id=f"h{i}b")
    await task
    for o in (held[0], waited):
        if o.status is not Status.SUCCESS:
            raise BenchError(f"handoff: {o.status.value} {o.error_class}: {o.message}")
    finished, granted = held[0].mark("finished"), waited.mark("lock_granted")
    assert finished is not None
    assert granted is not None
    return (granted.at - finished.at) * 1e3


async def handoffs(a: Daemon, b: Daemon, rounds: int) -> list[float]:
    path = "handoff.txt"
    (a.workspace / path).write_text("0\n")
    out = []
    async with AsyncClient(a.address) as ca, AsyncClient(b.address) as cb:
        for i in range(rounds):
            first, second = (ca, cb) if i % 2 == 0 else (cb, ca)
            out.append(await one_handoff(first, second, path, i))
    return out


# ------------------------------------------------------------------ latency


async def latencies(d: Daemon, rounds: int) -> dict[str, dict[str, float]]:
    out: dict[str, list[float]] = {"noop": [], "write_file": []}
    async with AsyncClient(d.address) as c:
        for i in range(rounds // 10):  # warm up
            await c.execute([Call(tool="noop", arguments={"echo": str(i)})])
        for i in range(rounds):
            for tool, args in (
                ("noop", {"echo": str(i)}),
                ("write_file", {"path": f"lat/{i % 8}.txt", "content": str(i)}),
            ):
                t0 = time.perf_counter()
                (o,) = await c.execute([Call(tool=tool, arguments=args)])
                out[tool].append((time.perf_counter() - t0) * 1e3)
                if o.status is not Status.SUCCESS:
                    raise BenchError(f"latency {tool}: {o.status.value}: {o.message}")
    return {k: figures(v) for k, v in out.items()}


# ------------------------------------------------------------------ schedule


async def spread(clients: list[AsyncClient], calls: list[Call]) -> tuple[list[Outcome], float]:
    """Call i to client i mod n, each share as one batch, all at once; outcomes in order."""
    shares = [calls[k :: len(clients)] for k in range(len(clients))]
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(c.execute(share) for c, share in zip(clients, shares, strict=True) if share)
    )
    makespan = time.perf_counter() - t0
    by_id = {o.call_id: o for share in results for o in share}
    return [by_id[c.call_id] for c in calls], makespan


async def schedules(
    three: list[Daemon], one: Daemon, args: argparse.Namespace
) -> list[dict[str, Any]]:
    rows = []
    rng = random.Random(args.seed)
    clients = [AsyncClient(d.address) for d in three]
    async with contextlib.AsyncExitStack() as stack:
        for c in clients:
            await stack.enter_async_context(c)
        alone = await stack.enter_async_context(AsyncClient(one.address))
        for b in range(args.batches):
            batch = make_batch(rng, args.calls, args.files, 0.3, 0.05, 0.25)
            preds = predecessors(batch)
            row: dict[str, Any] = {"batch": b, "calls": len(batch)}
            for name, runner, ws in (
                ("three_pg", lambda calls: spread(clients, calls), three[0].workspace),
                ("one_sqlite", lambda calls: spread([alone], calls), one.workspace),
            ):
                tag = f"b{b}-{name}"
                paths = counter_paths(tag, args.files)
                prepare(ws, paths)
                calls = make_calls(batch, paths, tag)
                outcomes, makespan = await runner(calls)
                check_ok(outcomes, calls, tag)
                measured = [_ran(o) for o in outcomes]
                cp, _ = critical_path(preds, measured)
                granted = sorted(range(len(batch)), key=lambda i: _at(outcomes[i], "lock_granted"))
                cp_actual, _ = critical_path(*in_order(batch, granted, measured))
                finals = [read_counter(ws / p) for p in paths]
                row[name] = {
                    "makespan_s": makespan,
                    "cp_measured_s": cp,
                    "ratio": makespan / cp,
                    "cp_grant_order_s": cp_actual,
                    "ratio_grant_order": makespan / cp_actual,
                    "lost_updates": lost_updates(batch, finals, args.files),
                    **costs(batch, outcomes),
                }
            t, o = row["three_pg"], row["one_sqlite"]
            print(
                f"  batch {b + 1}: three daemons on PostgreSQL {t['ratio']:.3f} x CP "
                f"({t['ratio_grant_order']:.3f} x CP in grant order; lost {t['lost_updates']}); "
                f"one daemon, SQLite {o['ratio']:.3f} x CP (lost {o['lost_updates']})\n"
                f"    median hand-off {t['handoff_ms']:.1f} / {o['handoff_ms']:.1f} ms, "
                f"writer's intent {t['intent_write_ms']:.1f} / {o['intent_write_ms']:.1f} ms "
                "(three daemons / one)",
                flush=True,
            )
            rows.append(row)
    return rows


def in_order(
    batch: list[Spec], order: list[int], measured: list[float]
) -> tuple[list[list[int]], list[float]]:
    """The conflict DAG of the calls taken in `order` (the order the lock table granted
    them) instead of proposal order, and their durations in that order: its critical path
    is the bound for the order the daemons chose, so the ratio to it is what the
    scheduling itself cost (hand-offs, intents), not the order."""
    taken = [batch[i] for i in order]
    preds = [[a for a in range(b) if conflicts(taken[a], taken[b])] for b in range(len(taken))]
    return preds, [measured[i] for i in order]


def costs(batch: list[Spec], outcomes: list[Outcome]) -> dict[str, float]:
    """Median ms of what a conflicting call pays: the hand-off (LOCK_GRANTED after the
    conflicting call it waited for FINISHED) and a writer's intent (STARTED after
    LOCK_GRANTED: the durable journal write)."""
    handoffs = []
    for j, oj in enumerate(outcomes):
        granted, queued = _at(oj, "lock_granted"), _at(oj, "queued")
        before = [
            _at(outcomes[i], "finished")
            for i in range(len(batch))
            if i != j
            and conflicts(batch[i], batch[j])
            and queued < _at(outcomes[i], "finished") <= granted
        ]
        if before:
            handoffs.append(granted - max(before))
    pairs = zip(batch, outcomes, strict=True)
    intents = [_at(o, "started") - _at(o, "lock_granted") for s, o in pairs if s.write]
    return {
        "handoff_ms": statistics.median(handoffs) * 1e3 if handoffs else 0.0,
        "intent_write_ms": statistics.median(intents) * 1e3 if intents else 0.0,
    }


def _at(o: Outcome, phase: str) -> float:
    m = o.mark(phase)
    assert m is not None, (o.call_id, phase)
    return m.at


def _ran(o: Outcome) -> float:
    m = {k.phase: k.at for k in o.timeline}
    return m["finished"] - m["started"]


# ------------------------------------------------------------------ the run


async def measure(root: Path, url: str, args: argparse.Namespace) -> dict[str, Any]:
    pg = ("--journal", url, "--locks", "postgresql")
    shared = root / "shared-ws"
    out: dict[str, Any] = {}
    print("hand-off between conflicting calls (ms):", flush=True)
    with started([daemon(root, "solo")]) as (solo,):
        base = await handoffs(solo, solo, args.handoffs)
    with started([daemon(root, f"h{i}", *pg, workspace=shared) for i in (1, 2)]) as (a, b):
        cross = await handoffs(a, b, args.handoffs)
    out["handoff_ms"] = {"in_process": figures(base), "two_daemons_pg": figures(cross)}
    for name, xs in (("one daemon, in-process locks", base), ("two daemons, PostgreSQL", cross)):
        print(f"  {name:<30} p50 {statistics.median(xs):6.2f}  p95 {pct(xs, 0.95):6.2f}")
    met = statistics.median(cross) <= HANDOFF_GOAL_MS
    print(f"  goal p50 <= {HANDOFF_GOAL_MS} ms: {'MET' if met else 'NOT MET'}", flush=True)

    print("Execute round trip, one call at a time (ms):", flush=True)
    kinds = (
        ("sqlite", ()),
        ("pg_journal", ("--journal", url)),
        ("pg_journal_and_locks", (*pg, "--lock-space", "latency")),
    )
    out["latency_ms"] = {}
    for name, extra in kinds:
        with started([daemon(root, f"lat-{name}", *extra)]) as (d,):
            (d.workspace / "lat").mkdir(exist_ok=True)
            got = await latencies(d, args.latency)
        out["latency_ms"][name] = got
        print(
            f"  {name:<22} noop p50 {got['noop']['p50']:6.2f} p95 {got['noop']['p95']:6.2f}   "
            f"write_file p50 {got['write_file']['p50']:6.2f} p95 {got['write_file']['p95']:6.2f}",
            flush=True,
        )
    base_lat = out["latency_ms"]["sqlite"]
    for name, _ in kinds[1:]:
        lat = out["latency_ms"][name]
        print(
            f"  {name} / sqlite (p50): noop {lat['noop']['p50'] / base_lat['noop']['p50']:.2f}x, "
            f"write_file {lat['write_file']['p50'] / base_lat['write_file']['p50']:.2f}x"
        )

    print("schedule.py batches spread over three daemons:", flush=True)
    trio = [
        daemon(root, f"s{i}", *pg, "--lock-space", "sched", workspace=root / "sws")
        for i in (1, 2, 3)
    ]
    with started([*trio, daemon(root, "one")]) as ds:
        rows = await schedules(ds[:3], ds[3], args)
    out["schedule"] = rows
    three = [r["three_pg"]["ratio"] for r in rows]
    actual = [r["three_pg"]["ratio_grant_order"] for r in rows]
    one = [r["one_sqlite"]["ratio"] for r in rows]
    lost = sum(r["three_pg"]["lost_updates"] for r in rows)
    print(
        f"  ratio median: three daemons {statistics.median(three):.3f} (max {max(three):.3f}; "
        f"in grant order {statistics.median(actual):.3f}), one daemon "
        f"{statistics.median(one):.3f}; goal <= {SCHEDULE_GOAL}: "
        f"{'MET' if statistics.median(three) <= SCHEDULE_GOAL else 'NOT MET'}; lost updates {lost}"
    )
    if lost:
        raise BenchError(f"three daemons lost {lost} update(s)")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run")
    p.add_argument("--handoffs", type=int, default=40)
    p.add_argument("--latency", type=int, default=200)
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if args.quick:
        args.handoffs, args.latency, args.batches, args.calls = 6, 20, 1, 15
    server = PgServer().start()
    try:
        with tempfile.TemporaryDirectory(prefix="execgate-bench-pg-") as tmp:
            root = Path(tmp)
            env = environment(root)
            results = asyncio.run(measure(root, server.database("bench"), args))
    except BenchError as exc:
        print(f"BROKEN: {exc}", file=sys.stderr)
        return 1
    finally:
        server.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"environment": env, **results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
