"""Fairness between agents: one agent floods the daemon, another's quick calls stay quick.

One real daemon (bwrap, durable journal, an identities file with two agents, `flood`
and `quick`; the policy gives every agent `quotas: concurrent: N`). Per round:

  idle       quick sends Q `read_file` calls of its own file, one Execute each, one
             after the other (20 ms apart): its latency on an idle daemon (the
             same-run baseline);
  flood      flood proposes F slow commands (`run_command` `sh -c 'sleep S; echo'`,
             each declaring it writes one of 64 files of its own), in batches of 1,000
             from a process of its own; once all of them have reached the lock queue
             (each WAITING or STARTED), quick sends its Q reads again; then flood's run
             is cancelled and the next idle measure waits for it to end;
  conflict   (optional) flood proposes C commands that declare nothing (each takes the
             whole workspace, so each of quick's reads conflicts with all of them);
             quick sends its reads once they wait. Reported: how many of flood's
             commands were granted while each read waited (fair order: at most 3; FIFO
             would be every command still queued) and the reads' p50.

Goal: quick's p50 under the flood <= 2x its idle p50 (idle before and after the flood
pooled). The load average and the CPU the rest of the machine used are printed beside
the figures; the exit status is non-zero only for breakage (a quick read that did not
succeed, a flood call with an unexpected outcome, a daemon that died), never for a time.

    .venv/bin/python bench/fairness.py            # 3 rounds, F = 2000, Q = 50
    .venv/bin/python bench/fairness.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/fairness.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

from bench.dispatch import environment  # noqa: E402
from execgate.client import Call, Client, EventKind, Outcome, Status  # noqa: E402
from execgate.executor.policy.identity import hash_token  # noqa: E402
from tests.daemon import Daemon  # noqa: E402

GOAL = 2.0
RESULTS = ROOT / "bench" / "results" / "fairness.json"
TOKENS = {"flood": "flood-" + "f" * 40, "quick": "quick-" + "q" * 40}
BATCH = 1000  # the most calls one Execute may carry


class BenchError(Exception):
    """Something broke (not: something was slow)."""


# ------------------------------------------------------------------ the daemon


@contextmanager
def daemon(tmp: Path, concurrent: int) -> Iterator[Daemon]:
    ids = "version: 1\nidentities:\n" + "".join(
        f"  - {{name: {n}, roles: [agent], token_sha256: {hash_token(t)}}}\n"
        for n, t in TOKENS.items()
    )
    (tmp / "identities.yaml").write_text(ids)
    quotas = f"quotas:\n  - {{agents: ['*'], concurrent: {concurrent}}}\n" if concurrent else ""
    (tmp / "policy.yaml").write_text(
        "version: 1\ndefault: deny\nrules:\n  - {id: all, effect: allow, tools: ['*']}\n" + quotas
    )
    home = tmp / "daemon"
    home.mkdir()
    d = Daemon(
        home, "--identities", str(tmp / "identities.yaml"), "--policy", str(tmp / "policy.yaml")
    ).start(timeout=60)
    d.workspace.mkdir(exist_ok=True)
    for sub in ("quick", "flood"):
        (d.workspace / sub).mkdir(exist_ok=True)
        os.chmod(d.workspace / sub, 0o777)
    (d.workspace / "quick" / "note.txt").write_text("a small file the quick agent reads\n")
    try:
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        if d.proc is not None and d.proc.returncode not in (0, None):
            raise BenchError(f"the daemon exited with {d.proc.returncode}")


# ------------------------------------------------------------------ the flooding agent


def slow_calls(count: int, seconds: float, declared: bool) -> list[Call]:
    calls = []
    for i in range(count):
        target = f"flood/f{i % 64}"
        args: dict[str, Any] = {"argv": ["sh", "-c", f"sleep {seconds}; echo {i} > {target}"]}
        if declared:
            args["writes"] = [target]
        calls.append(Call(tool="run_command", arguments=args, call_id=f"s{i:05d}"))
    return calls


def flood_worker(
    address: str, run: str, count: int, seconds: float, declared: bool, out: Any
) -> None:
    """In a process of its own: stream the calls, say when all are queued, then report."""
    calls = slow_calls(count, seconds, declared)
    seen: set[str] = set()
    outcomes: dict[str, Outcome] = {}
    lock = threading.Lock()
    said = threading.Event()

    def one(batch: list[Call]) -> None:
        with Client(address, token=TOKENS["flood"]) as c:
            for e in c.stream(batch, run_id=run):
                with lock:
                    if e.kind in (EventKind.WAITING, EventKind.STARTED, EventKind.FINISHED):
                        seen.add(e.call_id)
                    if e.kind is EventKind.FINISHED and e.outcome is not None:
                        outcomes[e.call_id] = e.outcome
                    if len(seen) == count and not said.is_set():
                        said.set()
                        out.put(("queued", time.time()))

    threads = [
        threading.Thread(target=one, args=(calls[i : i + BATCH],)) for i in range(0, count, BATCH)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = {
        cid: (o.status.value, o.error_class, *[(m.phase, m.at) for m in o.timeline])
        for cid, o in outcomes.items()
    }
    out.put(("done", report))


class Flood:
    """The flooding agent's process; `queued()` waits until every call reached the queue."""

    def __init__(self, d: Daemon, count: int, seconds: float, declared: bool) -> None:
        ctx = mp.get_context("spawn")
        self.run = f"flood-{uuid.uuid4().hex[:10]}"
        self.d = d
        self._out = ctx.Queue()
        args = (d.address, self.run, count, seconds, declared, self._out)
        self._proc = ctx.Process(target=flood_worker, args=args, daemon=True)
        self._proc.start()

    def queued(self, limit: float = 300) -> float:
        kind, at = self._out.get(timeout=limit)
        if kind != "queued":
            raise BenchError(f"the flood ended before all its calls were queued: {kind}")
        return float(at)

    def stop(self) -> dict[str, Any]:
        with Client(self.d.address, token=TOKENS["flood"]) as c:
            c.cancel(run_id=self.run, reason="bench: the measure is over", grace=0.2)
        kind, report = self._out.get(timeout=300)
        self._proc.join(30)
        if kind != "done":
            raise BenchError(f"the flood's process said {kind!r} at its end")
        return dict(report)


def flood_summary(report: dict[str, Any]) -> dict[str, Any]:
    """How the flood's calls ended, and the most that ran at once."""
    ends: dict[str, int] = {}
    edges = []
    for status, error, *marks in report.values():
        ends[f"{status}/{error}"] = ends.get(f"{status}/{error}", 0) + 1
        at = dict(marks)
        if "started" in at and "finished" in at:
            edges += [(at["started"], 1), (at["finished"], -1)]
    running = peak = 0
    for _, step in sorted(edges):
        running += step
        peak = max(peak, running)
    allowed = {
        "success/none",
        "rejected/cancelled",
        "failure/cancelled",
        "unknown_outcome/cancelled",
    }
    odd = {k: v for k, v in ends.items() if k not in allowed}
    if odd:
        raise BenchError(f"flood calls ended unexpectedly: {odd}")
    return {"ends": ends, "ran_at_once": peak}


# ------------------------------------------------------------------ the quick agent


def quick_reads(d: Daemon, count: int, gap: float = 0.0) -> tuple[list[float], list[Outcome]]:
    """`count` read_file calls, one Execute each, one after the other, `gap` seconds apart
    (an agent thinking between calls): latencies (s)."""
    run = f"quick-{uuid.uuid4().hex[:10]}"
    took, outcomes = [], []
    with Client(d.address, token=TOKENS["quick"]) as c:
        c.run(Call(tool="read_file", arguments={"path": "quick/note.txt"}), run_id=run)  # warm
        for i in range(count):
            call = Call(tool="read_file", arguments={"path": "quick/note.txt"}, call_id=f"r{i}")
            began = time.perf_counter()
            o = c.run(call, run_id=run)
            took.append(time.perf_counter() - began)
            if o.status is not Status.SUCCESS:
                raise BenchError(f"a quick read did not succeed: {o.status} {o.message}")
            outcomes.append(o)
            time.sleep(gap)
    return took, outcomes


class Cpu:
    """The cores the whole machine kept busy (from /proc/stat): the daemon, the flood's
    commands and everything else running here."""

    def __init__(self) -> None:
        self.began, self.wall = _busy(), time.monotonic()

    def others(self) -> float:
        """Cores busy on average since this was made."""
        return (_busy() - self.began) / max(time.monotonic() - self.wall, 1e-9)


def _busy() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def p50(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def p99(xs: Sequence[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


# ------------------------------------------------------------------ rounds


def fair_round(d: Daemon, args: argparse.Namespace) -> dict[str, Any]:
    before, _ = quick_reads(d, args.reads, args.gap)
    flood = Flood(d, args.flood, args.seconds, declared=True)
    flood.queued()
    cpu = Cpu()
    loaded, _ = quick_reads(d, args.reads, args.gap)
    busy = cpu.others()
    report = flood.stop()
    after, _ = quick_reads(d, args.reads, args.gap)
    idle = before + after
    return {
        "idle_p50_ms": p50(idle) * 1e3,
        "idle_p99_ms": p99(idle) * 1e3,
        "flood_p50_ms": p50(loaded) * 1e3,
        "flood_p99_ms": p99(loaded) * 1e3,
        "ratio": p50(loaded) / p50(idle),
        "machine_cores_busy": busy,
        "load": os.getloadavg()[0],
        "flood": flood_summary(report),
    }


def conflict_round(d: Daemon, args: argparse.Namespace) -> dict[str, Any]:
    flood = Flood(d, args.conflict, args.conflict_seconds, declared=False)
    flood.queued()
    _, reads = quick_reads(d, args.conflict_reads)
    report = flood.stop()
    granted = sorted(
        dict(marks)["lock_granted"]
        for _, _, *marks in report.values()
        if "lock_granted" in dict(marks)
    )
    ahead = []
    for o in reads:
        q, g = o.mark("queued"), o.mark("lock_granted")
        assert q is not None
        assert g is not None
        ahead.append(sum(q.at < t < g.at for t in granted))
    took = [o.mark("finished").at - o.mark("queued").at for o in reads]  # type: ignore[union-attr]
    return {
        "ahead_p50": p50(ahead),
        "ahead_max": max(ahead),
        "read_p50_ms": p50(took) * 1e3,
        "flood": flood_summary(report),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--flood", type=int, default=None, help="slow calls the flood proposes")
    p.add_argument("--seconds", type=float, default=0.5, help="how long each slow call sleeps")
    p.add_argument("--reads", type=int, default=None, help="quick reads per measure")
    p.add_argument("--gap", type=float, default=0.02, help="seconds between two quick reads")
    p.add_argument(
        "--concurrent", type=int, default=8, help="the agents' quota: concurrent (0: no quota)"
    )
    p.add_argument("--conflict", type=int, default=None, help="0: skip the conflict case")
    p.add_argument("--conflict-seconds", type=float, default=0.05)
    p.add_argument("--conflict-reads", type=int, default=20)
    p.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    for key, quick, full in (("rounds", 1, 3), ("flood", 200, 2000), ("reads", 20, 50),
                             ("conflict", 100, 1000)):  # fmt: skip
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    tmp = Path(tempfile.mkdtemp(prefix="eg-fair-"))
    env = environment(tmp)
    print(
        f"execgate fairness bench: {env['cpus']} cpus, load {env['loadavg_at_start']}; "
        f"flood {args.flood} x sleep {args.seconds}s, quotas concurrent {args.concurrent}, "
        f"{args.reads} quick reads per measure, {args.rounds} round(s)"
    )
    result: dict[str, Any] = {"rounds": [], "conflict": None, "environment": env}
    try:
        with daemon(tmp, args.concurrent) as d:
            for i in range(args.rounds):
                row = fair_round(d, args)
                result["rounds"].append(row)
                print(
                    f"round {i + 1}: quick p50 idle {row['idle_p50_ms']:.2f} ms "
                    f"(p99 {row['idle_p99_ms']:.2f}), under the flood {row['flood_p50_ms']:.2f} "
                    f"ms (p99 {row['flood_p99_ms']:.2f}): {row['ratio']:.2f}x; machine busy "
                    f"{row['machine_cores_busy']:.2f} cores, load {row['load']:.2f}; flood ran "
                    f"{row['flood']['ran_at_once']} at once, ended {row['flood']['ends']}"
                )
            if args.conflict:
                row = conflict_round(d, args)
                result["conflict"] = row
                print(
                    f"conflict: {args.conflict} commands that take the whole workspace; each "
                    f"quick read waited for {row['ahead_p50']:.0f} of them (p50; max "
                    f"{row['ahead_max']}), read p50 {row['read_p50_ms']:.1f} ms; FIFO would "
                    "be every command still queued"
                )
    except BenchError as exc:
        print(f"\nbench: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = statistics.median(r["ratio"] for r in result["rounds"])
    verdict = "meets" if ratio <= GOAL else "MISSES"
    print(
        f"\nquick p50 under the flood / idle: median {ratio:.2f}x ({verdict} the goal <= {GOAL}x)"
    )
    env["loadavg_at_end"] = os.getloadavg()
    result.update(ratio=ratio, goal=GOAL, config=vars(args) | {"json": str(args.json)})
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
