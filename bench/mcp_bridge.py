"""`execgate mcp`: what the bridge adds to a call, against a direct Execute.

One run measures, interleaved in rounds on this (small, shared) machine, one client
calling one at a time:

  execute      baseline: `Execute` of the read-only `noop` from the Python client
               (`AsyncClient.stream`, outcomes only: what the bridge sends), on the real
               daemon (`execgate serve --test-tools`, durable journal).
  execute_key  the same with an idempotency key, as the bridge always sends one (the
               call id when the client gives none): what the key costs the daemon.
  bridge       the same call as a `tools/call` through `execgate mcp` (the venv's console
               script), driven by the `mcp` SDK's `ClientSession` over stdio, as an MCP
               client launches it.
  sdk_echo     a `tools/call` on a bare SDK server that answers at once (this script
               with --echo-server: the SDK's low-level `Server` on the bridge's own
               stdio, client/mcpbridge/stdio.py), same client: what the MCP round trip
               costs by itself, without execgate.

Reported: p50/p99 of each (median round), the bridge's added ms over `execute` (p50 and
p99; goal <= 1.5 ms at p50) and the ratio, what is left once the bare MCP round trip is
taken off, and the CPU per call of each process (this one is the client). Beside each
figure: "others N cores", the CPU the rest of the machine used meanwhile. Results, with
every round, go to bench/results/mcp_bridge.json (git-ignored). The exit status reflects
breakage only (a call that did not succeed, a daemon that died), never a time.

    python bench/mcp_bridge.py                        # full run: 5 rounds x 200 calls
    python bench/mcp_bridge.py --quick                # smoke run
    python bench/mcp_bridge.py --rounds 9 --calls 300
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/mcp_bridge.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import mcp_types as types  # noqa: E402
import psutil  # noqa: E402
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.server.lowlevel import Server  # noqa: E402

from bench.dispatch import environment  # noqa: E402
from bench.tools import BenchError, median_round, rounds_of  # noqa: E402
from execgate.client import AsyncClient, Call, Status  # noqa: E402
from execgate.client.mcpbridge.stdio import served_stdio  # noqa: E402
from tests.daemon import Daemon  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "mcp_bridge.json"
GOALS = {"bridge_added_p50_ms": 1.5}
EXECGATE = Path(sys.prefix) / "bin" / "execgate"
THIS = Path(__file__).resolve()
ECHO = {"echo": "hi"}
Fn = Callable[[], Awaitable[None]]


# ------------------------------------------------------------------ the bare SDK server


async def _echo_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=(params.arguments or {})["echo"])])


async def _echo_list(
    ctx: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    schema = {"type": "object", "properties": {"echo": {"type": "string"}}}
    return types.ListToolsResult(tools=[types.Tool(name="noop", input_schema=schema)])


async def serve_echo() -> None:
    server: Server[Any] = Server("bench-echo", on_list_tools=_echo_list, on_call_tool=_echo_tool)
    async with served_stdio() as (read, write):
        await server.run(read, write, server.create_initialization_options())


# ------------------------------------------------------------------ the cases


@contextlib.asynccontextmanager
async def mcp_session(params: StdioServerParameters) -> AsyncIterator[tuple[ClientSession, int]]:
    """An initialized SDK session on the server `params` starts, and that server's pid."""
    before = {c.pid for c in psutil.Process().children()}
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        [pid] = [c.pid for c in psutil.Process().children() if c.pid not in before]
        yield session, pid


def mcp_call(session: ClientSession) -> Fn:
    async def call() -> None:
        result = await session.call_tool("noop", ECHO)
        texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
        if result.is_error or texts != ["hi"]:
            raise BenchError(f"tools/call did not succeed: {result}")

    return call


def execute(client: AsyncClient, keyed: bool) -> Fn:
    ids = itertools.count()

    async def call() -> None:
        call_id = f"bench-{'k' if keyed else 'n'}-{next(ids)}"
        spec = Call(tool="noop", arguments=ECHO, call_id=call_id)
        if keyed:
            spec = Call(tool="noop", arguments=ECHO, call_id=call_id, idempotency_key=call_id)
        async for event in client.stream([spec], progress=False):
            outcome = event.outcome
            if outcome is not None and (outcome.status, outcome.text) != (Status.SUCCESS, "hi"):
                raise BenchError(f"Execute did not succeed: {outcome}")

    return call


def _cpu(pid: int) -> float:
    """CPU seconds of the process alone (not its children: this one's are the others)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def cpu_per_call(fn: Fn, pids: dict[str, int], calls: int) -> dict[str, float]:
    """CPU ms per call of each process in `pids` while `fn` runs `calls` times."""
    before = {name: _cpu(pid) for name, pid in pids.items()}
    for _ in range(calls):
        await fn()
    return {name: (_cpu(pid) - before[name]) * 1000 / calls for name, pid in pids.items()}


async def measure(daemon: Daemon, rounds: int, per_round: int) -> dict[str, Any]:
    assert daemon.proc is not None
    env = {"EXECGATE_ADDR": daemon.address}
    bridge_params = StdioServerParameters(command=str(EXECGATE), args=["mcp"], env=env)
    echo_params = StdioServerParameters(command=sys.executable, args=[str(THIS), "--echo-server"])
    async with (
        AsyncClient(daemon.address, run_id="bench-mcp-bridge") as client,
        mcp_session(bridge_params) as (bridge, bridge_pid),
        mcp_session(echo_params) as (echo, echo_pid),
    ):
        cases = {
            "execute": execute(client, keyed=False),
            "execute_key": execute(client, keyed=True),
            "bridge": mcp_call(bridge),
            "sdk_echo": mcp_call(echo),
        }
        pids = [os.getpid(), daemon.proc.pid, bridge_pid, echo_pid]
        rows = await rounds_of(cases, rounds, per_round, pids)
        where = {
            "client": os.getpid(),
            "daemon": daemon.proc.pid,
            "bridge": bridge_pid,
            "sdk_server": echo_pid,
        }
        cpu = {
            case: await cpu_per_call(cases[case], where, per_round)
            for case in ("execute", "bridge", "sdk_echo")
        }
    return {"rounds": rows, "cpu_ms_per_call": cpu, **summary(rows)}


def summary(rows: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    bridge = median_round(rows, "execute", "bridge")
    p99 = sorted(row["bridge"]["p99"] - row["execute"]["p99"] for row in rows)
    echo = median_round(rows, "execute", "sdk_echo")["case"]
    return {
        "bridge": bridge,
        "bridge_added_p99_ms": p99[len(p99) // 2],
        "key": median_round(rows, "execute", "execute_key"),
        "sdk_echo": echo,
        "bridge_own_p50_ms": bridge["added_ms"] - echo["p50"],
    }


# ------------------------------------------------------------------ report


def print_report(res: dict[str, Any]) -> None:
    b = res["bridge"]

    def line(label: str, f: dict[str, float]) -> str:
        times = f"p50 {f['p50']:7.2f} ms  p99 {f['p99']:7.2f} ms"
        return f"  {label:<34} {times}  others {f['others']:4.2f} cores"

    print("\n== tools/call through execgate mcp vs a direct Execute (noop)")
    print(line("Execute (baseline)", b["base"]))
    print(line("Execute with an idempotency key", res["key"]["case"]))
    print(line("tools/call via execgate mcp", b["case"]))
    print(line("tools/call on a bare SDK server", res["sdk_echo"]))
    print(
        f"  added p50 {b['added_ms']:+.2f} ms (goal <= {GOALS['bridge_added_p50_ms']} ms), "
        f"p99 {res['bridge_added_p99_ms']:+.2f} ms; ratio {b['ratio']:.2f}x"
    )
    print(
        f"  of which the bare MCP round trip {res['sdk_echo']['p50']:.2f} ms; the rest "
        f"{res['bridge_own_p50_ms']:+.2f} ms (the key: {res['key']['added_ms']:+.2f} ms)"
    )
    print("  CPU ms per call (this process is the client):")
    for case, cpu in res["cpu_ms_per_call"].items():
        print(f"    {case:<9} " + "  ".join(f"{k} {v:.2f}" for k, v in cpu.items()))


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rounds, per_round = (2, 10) if args.quick else (args.rounds, args.calls)
    daemon = Daemon(tmp / "daemon")
    await asyncio.to_thread(daemon.start)
    try:
        res = await measure(daemon, rounds, per_round)
    finally:
        daemon.stop()
    return {"load_after": os.getloadavg(), **res}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, seconds")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=200, help="calls per case and round")
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server:
        anyio.run(serve_echo)
        return 0
    with tempfile.TemporaryDirectory(prefix="eg-bench-mcp-bridge-") as d:
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
