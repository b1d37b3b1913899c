"""Declared tools and MCP servers: what execgate adds to an MCP call and to a command.

One run measures, interleaved in rounds on this (small, shared) machine:

  mcp warm    `faulty.echo` (tests/fixtures/mcp/faulty_server.py, the official SDK's
              server) through the real daemon (bwrap, the server declared in the
              tools file, already started), against the same tools/call made
              directly with the SDK's `ClientSession` over `stdio_client` on the
              same server started the same way (bwrap with the arguments the
              daemon's sandbox gives it, the workspace writable: the server is
              untrusted, so its tools write). p50/p99 of both, the added p50 in ms
              (goal <= 1.5 ms) and the ratio; where an Execute's time goes (its
              timeline marks); in the same rounds the server again as `reader`
              (its echo declared read-only by the operator) and the built-in
              `noop` (what any Execute costs, without a tool).
  startup     per round, two fresh daemons: `prestart: true` and `prestart: false`;
              the time from spawning `execgate serve` until health says SERVING,
              and the first `faulty.echo` call after that (the channel warmed by a
              `noop` first); against a cold spawn: `stdio_client` spawning the
              server, `initialize`, the first tool result. An untrusted server's
              tools write, so discovery (read-only) is followed by a second,
              read-write start when prestart keeps it: serve time includes both.
  command     a declared command tool (`echo hi`, no `effects:`: the whole workspace,
              written, like run_command) against `run_command` of `echo hi`, same
              daemon and sandbox: p50/p99 and ratio (goal: no cost beyond noise).

Beside each figure: "others N cores", the CPU the rest of the machine used meanwhile
(machine busy time minus this process's and the daemon's, per second of wall time).
Each round's p50/p99 are computed; the median round is reported. Results, with
every round, go to bench/results/tools.json (git-ignored). The exit status reflects
breakage only (a call that did not succeed, a daemon that died), never a time.

    python bench/tools.py            # full run
    python bench/tools.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/tools.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import yaml  # noqa: E402
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402

from bench.dispatch import environment  # noqa: E402
from execgate.client import AsyncClient, Call, Outcome, Status  # noqa: E402
from execgate.executor.sandbox import Launch  # noqa: E402
from execgate.executor.sandbox.bwrap import bwrap_argv  # noqa: E402
from execgate.executor.tools.mcp.provider import BASE_ENV  # noqa: E402
from tests import mcp_support as ms  # noqa: E402
from tests.daemon import Daemon, reachable_workspace  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "tools.json"
GOALS = {"mcp_added_p50_ms": 1.5, "command_ratio": 1.0}
TEXT = "hi"
POLICY = """\
version: 1
default: deny
rules:
  - id: bench
    effect: allow
    tools: [noop, run_command, echo_hi, "faulty.*", "reader.*"]
    reason: the benchmark's tools
"""


class BenchError(Exception):
    """Something broke (not: something was slow)."""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# ------------------------------------------------------------------ the machine's load


def _busy() -> float:
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + t.softirq)


def _tree_cpu(pids: list[int]) -> float:
    """CPU seconds of these processes and their descendants (reaped children included)."""
    total = 0.0
    seen: set[int] = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                if p.pid in seen:
                    continue
                seen.add(p.pid)
                with contextlib.suppress(psutil.Error):
                    c = p.cpu_times()
                    total += c.user + c.system + c.children_user + c.children_system
    return total


@dataclass
class Meter:
    """Cores' worth of CPU the rest of the machine used while it ran."""

    pids: list[int]
    _t0: float = 0.0
    _m0: float = 0.0
    _o0: float = 0.0

    def __enter__(self) -> Meter:
        self._t0, self._m0, self._o0 = time.perf_counter(), _busy(), _tree_cpu(self.pids)
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._t0
        ours = _tree_cpu(self.pids) - self._o0
        # /proc/stat counts in 10 ms ticks: short samples are coarse, so clamp.
        others = max(0.0, _busy() - self._m0 - ours) / max(wall, 1e-9)
        self.others = min(others, float(os.cpu_count() or 1))


# ------------------------------------------------------------------ the daemon


def tools_yaml(tag: str, prestart: bool, reader: bool) -> str:
    """The command tool `echo_hi`, the untrusted fixture server `faulty` (its tools
    write), and with `reader` the same server as `reader`, its echo a reader."""
    doc: dict[str, Any] = {
        "version": 1,
        "tools": [
            {
                "name": "echo_hi",
                "description": "echo hi (the whole workspace, written: no effects key)",
                "input_schema": {"type": "object", "properties": {}},
                "argv": ["echo", TEXT],
            }
        ],
        "servers": [_server("faulty", tag, prestart)],
    }
    if reader:  # the same server, its echo declared a reader by the operator
        doc["servers"].append(_server("reader", tag, prestart, {"echo": {"read_only": True}}))
    return yaml.safe_dump(doc, sort_keys=False)


def _server(name: str, tag: str, prestart: bool, tools: dict[str, Any] | None = None) -> Any:
    command, args = ms.fixture_server()
    decl = {
        "name": name,
        "command": command,
        "args": list(args),
        "env": {"set": {ms.TAG_ENV: tag}},
        "prestart": prestart,
    }
    return decl | ({"tools": tools} if tools else {})


class TimedDaemon(Daemon):
    """A Daemon whose start is timed: spawn to health SERVING, polled every 5 ms."""

    serve_s = 0.0

    def start(self, timeout: float = 60.0) -> Daemon:
        t0 = time.perf_counter()
        super().start(timeout)
        self.serve_s = time.perf_counter() - t0
        return self

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout * 4
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            if self.socket.exists() and self.serving(timeout=1.0):
                return
            time.sleep(0.005)
        raise BenchError(f"daemon not serving after {timeout * 4:.0f}s:\n{self.log()}")


def make_daemon(root: Path, tag: str, prestart: bool, reader: bool = False) -> TimedDaemon:
    root.mkdir(parents=True, exist_ok=True)
    (root / "policy.yaml").write_text(POLICY)
    (root / "tools.yaml").write_text(tools_yaml(tag, prestart, reader))
    ro = [a for p in ms.RO_PATHS for a in ("--sandbox-ro", str(p))]
    return TimedDaemon(
        root,
        "--sandbox",
        "bwrap",
        *ro,
        "--policy",
        str(root / "policy.yaml"),
        "--tools",
        str(root / "tools.yaml"),
    )


async def checked(client: AsyncClient, call: Call, want: str | None) -> Outcome:
    """Run `call`; BenchError unless it succeeds with text `want` (None: any text)."""
    outcome = await client.run(call)
    wrong = want is not None and outcome.text.strip() != want
    if outcome.status is not Status.SUCCESS or wrong:
        raise BenchError(f"{call.tool}: {outcome.status} {outcome.text!r} {outcome.message}")
    return outcome


Trace = tuple[Outcome, float, float]  # the outcome, client send and receive wall time


def via_daemon(
    client: AsyncClient,
    tool: str,
    arguments: dict[str, Any],
    want: str | None,
    traces: list[Trace] | None = None,
) -> Fn:
    async def once() -> None:
        w0 = time.time()
        outcome = await checked(client, Call(tool=tool, arguments=arguments), want)
        if traces is not None:
            traces.append((outcome, w0, time.time()))

    return once


SEGMENTS = (
    ("in", "client send -> queued mark (gRPC in, servicer, call task)"),
    ("admit", "queued -> lock_granted (validation, policy, locks)"),
    ("intent", "lock_granted -> started (journal intent)"),
    ("tool", "started -> finished mark (the MCP tools/call round trip and result)"),
    ("out", "finished mark -> client has it (journal outcome, gRPC out, client)"),
)


def breakdown(traces: list[Trace]) -> dict[str, float]:
    """Median ms of each segment of an Execute (daemon and client share one clock)."""
    per: dict[str, list[float]] = {name: [] for name, _ in SEGMENTS}
    for outcome, w0, w1 in traces:
        at = {m.phase: m.at for m in outcome.timeline}
        phases = ("queued", "lock_granted", "started", "finished")
        if not all(p in at for p in phases):
            continue
        points = [w0, *(at[p] for p in phases), w1]
        for (name, _), a, b in zip(SEGMENTS, points, points[1:], strict=False):
            per[name].append((b - a) * 1000)
    return {k: statistics.median(v) for k, v in per.items() if v}


# ------------------------------------------------------------------ the server, directly


def direct_params(workspace: Path, tag: str) -> StdioServerParameters:
    """The fixture server in bwrap as the daemon's sandbox starts it (writable workspace:
    an untrusted server's tools write), spawned by the SDK itself."""
    command, args = ms.fixture_server()
    launch = Launch(
        argv=(command, *args),
        cwd=workspace,
        env={**BASE_ENV, ms.TAG_ENV: tag},
        stdin=None,
        workspace=workspace,
        writable=True,
        marker=secrets.token_hex(8),
        serve=True,
    )
    argv = bwrap_argv(launch, extra_ro=ms.RO_PATHS)
    return StdioServerParameters(command=argv[0], args=argv[1:])


async def echo(session: ClientSession) -> None:
    result = await session.call_tool("echo", {"text": TEXT})
    content = getattr(result, "content", None) or []
    text = "".join(getattr(c, "text", "") for c in content)
    if getattr(result, "is_error", False) or getattr(result, "isError", False) or text != TEXT:
        raise BenchError(f"direct echo: {result!r}")


@contextlib.asynccontextmanager
async def direct_session(params: StdioServerParameters) -> AsyncIterator[ClientSession]:
    with open(os.devnull, "w") as errlog:  # noqa: ASYNC230 -- /dev/null does not block
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


async def cold_spawn(params: StdioServerParameters) -> float:
    """Seconds from spawning the server to its first tool result (initialize included)."""
    t0 = time.perf_counter()
    async with direct_session(params) as session:
        await echo(session)
        elapsed = time.perf_counter() - t0
    return elapsed


# ------------------------------------------------------------------ interleaved rounds

Fn = Callable[[], Awaitable[None]]


async def rounds_of(
    cases: dict[str, Fn], rounds: int, per_round: int, pids: list[int]
) -> list[dict[str, dict[str, float]]]:
    """Per round, per case: p50/p99 ms of `per_round` calls, and the others' load."""
    for fn in cases.values():  # warm-up
        for _ in range(5):
            await fn()
    out = []
    for r in range(rounds):
        row = {}
        for name, fn in cases.items():
            ms_: list[float] = []
            with Meter(pids) as meter:
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    await fn()
                    ms_.append((time.perf_counter() - t0) * 1000)
            row[name] = {"p50": pct(ms_, 0.5), "p99": pct(ms_, 0.99), "others": meter.others}
        out.append(row)
        print(
            f"  round {r + 1}/{rounds}  " + "  ".join(f"{k} {v['p50']:.2f}" for k, v in row.items())
        )
    return out


def median_round(rows: list[dict[str, dict[str, float]]], base: str, case: str) -> dict[str, Any]:
    """The median over rounds of each figure of `case`, with ratio and added ms vs `base`."""

    def med(f: Callable[[dict[str, dict[str, float]]], float]) -> float:
        return statistics.median(f(row) for row in rows)

    def figures(name: str) -> dict[str, float]:
        return {
            k: statistics.median(row[name][k] for row in rows) for k in ("p50", "p99", "others")
        }

    return {
        "base": figures(base),
        "case": figures(case),
        "ratio": med(lambda r: r[case]["p50"] / r[base]["p50"]),
        "added_ms": med(lambda r: r[case]["p50"] - r[base]["p50"]),
    }


# ------------------------------------------------------------------ the three measures


async def warm_cases(daemon: Daemon, tag: str, rounds: int, per_round: int) -> dict[str, Any]:
    assert daemon.proc is not None
    params = direct_params(daemon.workspace, tag)
    async with AsyncClient(daemon.address, run_id="bench-tools") as client:
        async with direct_session(params) as session:
            pids = [os.getpid(), daemon.proc.pid]
            traces: list[Trace] = []
            reader_traces: list[Trace] = []
            print("mcp warm: direct (SDK) vs execgate, p50 ms")
            mcp_rows = await rounds_of(
                {
                    "direct": lambda: echo(session),
                    "execgate": via_daemon(client, "faulty.echo", {"text": TEXT}, TEXT, traces),
                    "reader": via_daemon(
                        client, "reader.echo", {"text": TEXT}, TEXT, reader_traces
                    ),
                    "noop": via_daemon(client, "noop", {}, None),
                },
                rounds,
                per_round,
                pids,
            )
        print("command: run_command vs declared, p50 ms")
        cmd_rows = await rounds_of(
            {
                "run_command": via_daemon(client, "run_command", {"argv": ["echo", TEXT]}, TEXT),
                "declared": via_daemon(client, "echo_hi", {}, TEXT),
            },
            rounds,
            per_round,
            pids,
        )
    return {
        "mcp": {
            **median_round(mcp_rows, "direct", "execgate"),
            "segments_ms": breakdown(traces[5:]),  # the warm-up's left out
            "rounds": mcp_rows,
        },
        "mcp_reader": {
            **median_round(mcp_rows, "direct", "reader"),
            "segments_ms": breakdown(reader_traces[5:]),
        },
        "noop": median_round(mcp_rows, "direct", "noop"),
        "command": {**median_round(cmd_rows, "run_command", "declared"), "rounds": cmd_rows},
    }


async def first_call(daemon: Daemon) -> tuple[float, float]:
    """(ms of the first faulty.echo after start, others' cores meanwhile)."""
    assert daemon.proc is not None
    async with AsyncClient(daemon.address, run_id="bench-first") as client:
        await checked(client, Call(tool="noop"), None)  # the channel, not the server
        with Meter([os.getpid(), daemon.proc.pid]) as meter:
            t0 = time.perf_counter()
            await checked(client, Call(tool="faulty.echo", arguments={"text": TEXT}), TEXT)
            elapsed = (time.perf_counter() - t0) * 1000
    return elapsed, meter.others


async def startup_round(tmp: Path, r: int, tag: str) -> dict[str, dict[str, float]]:
    row: dict[str, dict[str, float]] = {}
    params = direct_params(tmp / "cold" / "workspace", tag)
    with Meter([os.getpid()]) as meter:
        cold = await cold_spawn(params)
    row["cold_spawn"] = {"ms": cold * 1000, "others": meter.others}
    for prestart in (True, False):
        name = "prestart" if prestart else "no_prestart"
        daemon = make_daemon(tmp / f"start-{r}-{name}", tag, prestart)
        with Meter([os.getpid()]) as meter:
            await asyncio.to_thread(daemon.start)
        try:
            ms_first, others = await first_call(daemon)
        finally:
            daemon.stop()
        row[name] = {"serve_ms": daemon.serve_s * 1000, "serve_others": meter.others}
        row[name] |= {"first_call_ms": ms_first, "first_others": others}
    return row


async def startup_cases(tmp: Path, tag: str, rounds: int) -> dict[str, Any]:
    ws = tmp / "cold" / "workspace"
    reachable_workspace(ws)
    ws.mkdir(parents=True, exist_ok=True)
    rows = []
    print("startup: cold spawn, daemon serve and first call, ms")
    for r in range(rounds):
        row = await startup_round(tmp, r, tag)
        rows.append(row)
        pre, no = row["prestart"], row["no_prestart"]
        print(
            f"  round {r + 1}/{rounds}  cold {row['cold_spawn']['ms']:.0f}  "
            f"serve {pre['serve_ms']:.0f}/{no['serve_ms']:.0f}  "
            f"first {pre['first_call_ms']:.1f}/{no['first_call_ms']:.1f}  (prestart/no)"
        )
    med = {
        case: {k: statistics.median(row[case][k] for row in rows) for k in rows[0][case]}
        for case in rows[0]
    }
    return {**med, "rounds": rows}


# ------------------------------------------------------------------ report


def print_report(res: dict[str, Any]) -> None:
    m, c, s = res["mcp"], res["command"], res["startup"]

    def line(label: str, f: dict[str, float]) -> str:
        times = f"p50 {f['p50']:7.2f} ms  p99 {f['p99']:7.2f} ms"
        return f"  {label:<24} {times}  others {f['others']:4.2f} cores"

    print("\n== MCP warm call (faulty.echo, bwrap)")
    print(line("direct (SDK session)", m["base"]))
    print(line("execgate Execute", m["case"]))
    print(
        f"  added p50 {m['added_ms']:+.2f} ms (goal <= {GOALS['mcp_added_p50_ms']} ms)"
        f"  ratio {m['ratio']:.2f}x"
    )
    rd = res["mcp_reader"]
    print("  where an Execute's time goes (median ms): writer (faulty), reader")
    for name, what in SEGMENTS:
        w, r = (x["segments_ms"].get(name, float("nan")) for x in (m, rd))
        print(f"    {name:<7} {w:6.2f} {r:6.2f}  {what}")
    print(line("execgate, echo a reader", rd["case"]))
    print(f"  added p50 {rd['added_ms']:+.2f} ms  ratio {rd['ratio']:.2f}x")
    print(line("execgate noop (any call)", res["noop"]["case"]))
    print("\n== Command tool (echo hi, bwrap)")
    print(line("run_command", c["base"]))
    print(line("declared echo_hi", c["case"]))
    print(f"  ratio {c['ratio']:.2f}x  added p50 {c['added_ms']:+.2f} ms (goal: noise)")
    print("\n== Startup (median of rounds)")
    cs = s["cold_spawn"]
    print(
        f"  cold spawn to first result (SDK)  {cs['ms']:7.1f} ms  others {cs['others']:4.2f} cores"
    )
    for name in ("prestart", "no_prestart"):
        d = s[name]
        print(
            f"  {name:<12} serve {d['serve_ms']:7.1f} ms  others {d['serve_others']:4.2f}"
            f"  first call {d['first_call_ms']:7.1f} ms  others {d['first_others']:4.2f} cores"
        )


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rounds, per_round, start_rounds = (2, 5, 1) if args.quick else (5, 100, 3)
    tag = ms.new_tag()
    daemon = make_daemon(tmp / "warm", tag, prestart=True, reader=True)
    await asyncio.to_thread(daemon.start)
    try:
        warm = await warm_cases(daemon, tag, rounds, per_round)
    finally:
        daemon.stop()
    startup = await startup_cases(tmp, tag, start_rounds)
    left = ms.tagged(tag)
    if left:
        raise BenchError(f"server processes left after the daemons stopped: {left}")
    return {**warm, "startup": startup}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, seconds")
    args = parser.parse_args()
    if (
        not ms.FIXTURE.exists()
        or subprocess.run(["bwrap", "--version"], capture_output=True).returncode
    ):
        print("bench/tools.py needs bwrap and tests/fixtures/mcp", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="eg-bench-tools-") as d:
        tmp = Path(d)
        env = environment(tmp)
        print(json.dumps(env))
        try:
            res = asyncio.run(run(args, tmp))
        except BenchError as exc:
            print(f"BROKEN: {exc}", file=sys.stderr)
            return 1
    print_report(res)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"environment": env, "goals": GOALS, **res}, indent=2) + "\n")
    print(f"\nresults: {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
