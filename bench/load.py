"""Many agents on one daemon: 64 clients x 100 calls of a mixed load, in each sharing mode.

Each client is an identity of its own and sends its calls one at a time (one
ExecuteBatch each), all clients at once, against a real daemon (bwrap, durable
journal, `--test-tools`). The `mixed` mix, per client, seeded:

  read     read_file of its own file (25 %) or of a shared file (10 %)
  write    write_file of its own file (20 %)
  bump     `work` (a real process in bwrap: read a shared counter, write it + 1) on
           one of 4 shared counters (10 %): lost updates show on the counters
  command  run_command `sh -c 'cat notes.txt; echo N > out.txt'` in its own
           directory (35 %)

The `commands` mix is commands only. Each mode is a fresh daemon:

  one          today's shape: one workspace for everyone; a command declares nothing,
               so it takes the whole workspace and every other call waits for it
  declared     one workspace; each command declares what it reads and writes
               (`reads: [notes.txt]`, `writes: [out.txt]`), which bwrap enforces
  workspaces   each client its own workspace (policy `workspaces: home ->
               spaces/{agent}`), the shared files in a workspace `shared` given to
               all; commands declare nothing (each takes only its own workspace)
  nolocks      as `one` with `--locks none`: no scheduling at all, the ceiling (it loses
               updates; it is there to say what the locks cost)

Reported per mode: calls/s over the measured phase, p50/p99 latency (the client's),
per kind, the share of the calls' daemon time spent waiting for locks (from each
outcome's `queued` -> `lock_granted` marks), the throughput against `nolocks`, and
lost updates (increments proposed - the counters' increase; must be 0 but under
`nolocks`). The exit status is non-zero only when something broke (a call that did
not succeed, a lost update under a mode with locks, a daemon that died), never for a
time.

    .venv/bin/python bench/load.py                      # every mode, both mixes
    .venv/bin/python bench/load.py --quick              # 8 clients x 20 calls
    .venv/bin/python bench/load.py --modes one,workspaces --mix commands
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/load.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

from bench.dispatch import environment  # noqa: E402
from bench.fairness import Cpu  # noqa: E402
from execgate.client import AsyncClient, Call, Outcome, Status  # noqa: E402
from execgate.executor.policy.identity import hash_token  # noqa: E402
from tests.daemon import Daemon  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "load.json"
MODES = ("one", "declared", "workspaces", "nolocks")
MIXES = ("mixed", "commands")
COUNTERS = 4
SHARED_FILES = 4
# The mixed load: kind -> share of the calls.
MIXED = {"read_own": 25, "read_shared": 10, "write": 20, "bump": 10, "command": 35}


class BenchError(Exception):
    """Something broke (not: something was slow)."""


def token(i: int) -> str:
    return f"c{i:02d}-" + "t" * 40


def agent(i: int) -> str:
    return f"c{i:02d}"


# ------------------------------------------------------------------ the daemon


def policy(tmp: Path, mode: str) -> str:
    text = "version: 1\ndefault: deny\nrules:\n  - {id: all, effect: allow, tools: ['*']}\n"
    if mode == "workspaces":
        text += (
            "workspaces:\n"
            f'  - {{name: home, root: "{tmp}/spaces/{{agent}}"}}\n'
            f'  - {{name: shared, root: "{tmp}/shared"}}\n'
        )
    return text


@contextmanager
def daemon(tmp: Path, mode: str, clients: int) -> Iterator[Daemon]:
    ids = "version: 1\nidentities:\n" + "".join(
        f"  - {{name: {agent(i)}, roles: [agent], token_sha256: {hash_token(token(i))}}}\n"
        for i in range(clients)
    )
    (tmp / "identities.yaml").write_text(ids)
    (tmp / "policy.yaml").write_text(policy(tmp, mode))
    home = tmp / "daemon"
    home.mkdir()
    extra = ["--locks", "none"] if mode == "nolocks" else []
    d = Daemon(
        home,
        "--identities",
        str(tmp / "identities.yaml"),
        "--policy",
        str(tmp / "policy.yaml"),
        "--sandbox",
        "bwrap",
        *extra,
    ).start(timeout=60)
    try:
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        if d.proc is not None and d.proc.returncode not in (0, None):
            raise BenchError(f"the daemon exited with {d.proc.returncode}:\n{d.log()[-2000:]}")


# ------------------------------------------------------------------ the calls


@dataclass(frozen=True)
class Place:
    """Where a client's calls go in a mode: its own directory and the shared one, each
    as (workspace name, path prefix)."""

    own: tuple[str, str]
    shared: tuple[str, str]


def place(mode: str, i: int) -> Place:
    if mode == "workspaces":
        return Place(("home", ""), ("shared", ""))
    return Place(("", f"{agent(i)}/"), ("", "shared/"))


@dataclass(frozen=True)
class Planned:
    kind: str
    call: Call
    workspace: str
    # The shared counter it increments (bump), else "".
    counter: str = ""


def plan(mode: str, mix: str, i: int, calls: int, seed: int) -> list[Planned]:
    rng = random.Random(seed * 1000 + i)
    where = place(mode, i)
    kinds = list(MIXED) if mix == "mixed" else ["command"]
    weights = list(MIXED.values()) if mix == "mixed" else [1]
    out = []
    for n in range(calls):
        kind = rng.choices(kinds, weights)[0]
        out.append(one_call(kind, mode, where, f"{agent(i)}-{n:03d}", rng))
    return out


def one_call(kind: str, mode: str, where: Place, call_id: str, rng: random.Random) -> Planned:
    (own_ws, own), (sh_ws, sh) = where.own, where.shared
    match kind:
        case "read_own":
            return Planned(kind, Call(tool="read_file", arguments={"path": f"{own}notes.txt"},
                                      call_id=call_id), own_ws)  # fmt: skip
        case "read_shared":
            path = f"{sh}data-{rng.randrange(SHARED_FILES)}.txt"
            return Planned(kind, Call(tool="read_file", arguments={"path": path},
                                      call_id=call_id), sh_ws)  # fmt: skip
        case "write":
            args = {"path": f"{own}w-{rng.randrange(4)}.txt", "content": call_id}
            return Planned(kind, Call(tool="write_file", arguments=args, call_id=call_id), own_ws)
        case "bump":
            counter = f"{sh}counter-{rng.randrange(COUNTERS)}.txt"
            args = {"path": counter, "write": True, "seconds": 0}
            return Planned(kind, Call(tool="work", arguments=args, call_id=call_id), sh_ws, counter)
        case _:
            return Planned("command", command(mode, own, call_id), own_ws)


def command(mode: str, own: str, call_id: str) -> Call:
    script = f"cat notes.txt > /dev/null && echo {call_id} > out.txt && echo ok"
    args: dict[str, Any] = {"argv": ["sh", "-c", script], "cwd": own or "."}
    if mode == "declared":
        args["reads"] = [f"{own}notes.txt"]
        args["writes"] = [f"{own}out.txt"]
    return Call(tool="run_command", arguments=args, call_id=call_id)


# ------------------------------------------------------------------ one mode


@dataclass
class Done:
    kind: str
    latency: float
    outcome: Outcome


@dataclass
class Tally:
    done: list[Done] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


async def prepare(d: Daemon, mode: str, clients: int) -> None:
    """Each client's notes.txt, empty out.txt, the shared files and counters (0), made
    through the daemon so they are where its calls will look (and owned as they would be)."""
    writes: list[tuple[int, str, str, str]] = []
    for i in range(clients):
        (own_ws, own) = place(mode, i).own
        writes += [(i, own_ws, f"{own}notes.txt", "notes\n"), (i, own_ws, f"{own}out.txt", "")]
    sh_ws, sh = place(mode, 0).shared
    writes += [(0, sh_ws, f"{sh}data-{k}.txt", f"data {k}\n") for k in range(SHARED_FILES)]
    writes += [(0, sh_ws, f"{sh}counter-{k}.txt", "0\n") for k in range(COUNTERS)]
    for i, ws, path, content in writes:
        made = Call(tool="write_file", arguments={"path": path, "content": content})
        async with AsyncClient(d.address, token=token(i), workspace=ws) as c:
            [o] = await c.execute([made])
            if o.status is not Status.SUCCESS:
                raise BenchError(f"setup {path}: {o.status.value} {o.message}")


async def client_loop(
    address: str, i: int, planned: list[Planned], tally: Tally, start: asyncio.Event
) -> None:
    async with AsyncClient(address, token=token(i)) as c:
        await c.list_tools()  # the channel up before the clock starts
        await start.wait()
        for p in planned:
            began = time.perf_counter()
            [o] = await c.execute([p.call], workspace=p.workspace)
            tally.done.append(Done(p.kind, time.perf_counter() - began, o))
            if o.status is not Status.SUCCESS:
                tally.failed.append(
                    f"{p.call.call_id} {p.kind}: {o.status.value} {o.message}: {o.text[-300:]!r}"
                )


async def measure(d: Daemon, mode: str, mix: str, args: argparse.Namespace) -> dict[str, Any]:
    await prepare(d, mode, args.clients)
    plans = [plan(mode, mix, i, args.calls, args.seed) for i in range(args.clients)]
    tally, start = Tally(), asyncio.Event()
    loops = [
        asyncio.create_task(client_loop(d.address, i, plans[i], tally, start))
        for i in range(args.clients)
    ]
    await asyncio.sleep(0.5)  # every client connected (list_tools) before the clock starts
    cpu, began = Cpu(), time.perf_counter()
    start.set()
    await asyncio.gather(*loops)
    wall = time.perf_counter() - began
    busy = cpu.others()
    bumps: dict[str, int] = {}
    for p in (p for ps in plans for p in ps if p.counter):
        bumps[p.counter] = bumps.get(p.counter, 0) + 1
    return summary(tally, wall, busy, lost_updates(d, mode, bumps))


def lost_updates(d: Daemon, mode: str, bumps: dict[str, int]) -> int:
    base = d.root.parent / "shared" if mode == "workspaces" else d.workspace
    lost = 0
    for path, proposed in bumps.items():
        value = int((base / path).read_text().strip() or 0)
        lost += proposed - value
    return lost


def summary(tally: Tally, wall: float, busy: float, lost: int) -> dict[str, Any]:
    lat = [x.latency for x in tally.done]
    waited = spent = 0.0
    for x in tally.done:
        queued, granted, ended = (x.outcome.mark(p) for p in ("queued", "lock_granted", "finished"))
        if queued and granted and ended:
            waited += granted.at - queued.at
            spent += ended.at - queued.at
    kinds = {}
    for kind in sorted({x.kind for x in tally.done}):
        mine = [x.latency for x in tally.done if x.kind == kind]
        kinds[kind] = {"calls": len(mine), "p50_ms": p50(mine) * 1e3, "p99_ms": p99(mine) * 1e3,
                       "per_s": len(mine) / wall}  # fmt: skip
    return {
        "calls": len(lat),
        "seconds": wall,
        "calls_per_s": len(lat) / wall,
        "p50_ms": p50(lat) * 1e3,
        "p99_ms": p99(lat) * 1e3,
        "lock_wait_share": waited / spent if spent else 0.0,
        "lost_updates": lost,
        "failed": tally.failed[:20],
        "failed_count": len(tally.failed),
        "machine_cores_busy": busy,
        "load": os.getloadavg()[0],
        "kinds": kinds,
    }


def p50(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def p99(xs: Sequence[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def run_mode(mode: str, mix: str, args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"eg-load-{mode}-"))
    try:
        with daemon(tmp, mode, args.clients) as d:
            row = asyncio.run(measure(d, mode, mix, args))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return row


# ------------------------------------------------------------------ the report


def print_row(mix: str, mode: str, row: dict[str, Any], ceiling: float | None) -> None:
    vs = f"{row['calls_per_s'] / ceiling:5.0%} of nolocks" if ceiling else ""
    print(
        f"{mix:<8} {mode:<11} {row['calls_per_s']:7.1f} calls/s  p50 {row['p50_ms']:7.1f} ms  "
        f"p99 {row['p99_ms']:7.1f} ms  lock wait {row['lock_wait_share']:5.1%}  "
        f"lost {row['lost_updates']:3d}  failed {row['failed_count']}  {vs}  "
        f"busy {row['machine_cores_busy']:.2f} cores, "
        f"load {row['load']:.1f}"
    )
    cmd = row["kinds"].get("command")
    if cmd:
        print(f"{'':<20} commands {cmd['per_s']:6.1f}/s p50 {cmd['p50_ms']:7.1f} ms "
              f"p99 {cmd['p99_ms']:7.1f} ms")  # fmt: skip


def problems(mix: str, mode: str, row: dict[str, Any]) -> list[str]:
    """What broke in a mode (reported after every mode has run, so one bad call does not
    throw the other figures away)."""
    found = []
    if row["failed_count"]:
        found.append(f"{mix}/{mode}: {row['failed_count']} calls did not succeed: {row['failed']}")
    if mode != "nolocks" and row["lost_updates"]:
        found.append(f"{mix}/{mode}: {row['lost_updates']} lost updates on the shared counters")
    return found


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: 8 clients x 20 calls")
    p.add_argument("--clients", type=int, default=None)
    p.add_argument("--calls", type=int, default=None, help="calls per client")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--mix", default="mixed,commands", help="mixed, commands, or both")
    p.add_argument("--rounds", type=int, default=1, help="each mode this many times, interleaved")
    p.add_argument("--seed", type=int, default=18)
    p.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.clients = args.clients or (8 if args.quick else 64)
    args.calls = args.calls or (20 if args.quick else 100)
    args.modes = [m for m in args.modes.split(",") if m]
    args.mixes = [m for m in args.mix.split(",") if m]
    for m in args.modes:
        if m not in MODES:
            p.error(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    for m in args.mixes:
        if m not in MIXES:
            p.error(f"--mix: {m!r} is not one of {', '.join(MIXES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment(Path(tempfile.gettempdir()))
    print(
        f"execgate load bench: {env['cpus']} cpus, load {env['loadavg_at_start']}; "
        f"{args.clients} clients x {args.calls} calls, modes {', '.join(args.modes)}, "
        f"mixes {', '.join(args.mixes)}, {args.rounds} round(s)"
    )
    rows: list[dict[str, Any]] = []
    broke: list[str] = []
    try:
        for r in range(args.rounds):
            for mix in args.mixes:
                found: dict[str, dict[str, Any]] = {}
                for mode in args.modes:
                    row = run_mode(mode, mix, args)
                    broke += problems(mix, mode, row)
                    found[mode] = row
                    rows.append({"round": r, "mix": mix, "mode": mode, **row})
                ceiling = found.get("nolocks", {}).get("calls_per_s")
                for mode, row in found.items():
                    print_row(mix, mode, row, ceiling)
    except BenchError as exc:
        print(f"\nbench: FAILED: {exc}", file=sys.stderr)
        return 1
    env["loadavg_at_end"] = os.getloadavg()
    result = {"rows": rows, "environment": env, "config": vars(args) | {"json": str(args.json)}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"results: {args.json}")
    for line in broke:
        print(f"bench: BROKEN: {line}", file=sys.stderr)
    return 1 if broke else 0


if __name__ == "__main__":
    sys.exit(main())
