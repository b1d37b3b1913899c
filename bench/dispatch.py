"""Dispatch overhead: what an Execute call costs on top of a bare gRPC round trip.

One run measures, with 1 and with 32 concurrent clients, p50/p99 latency and
throughput of:

  echo           a bare grpc.aio unary echo (generic handler, raw bytes) in its own
                 process, with the daemon's server options -- the baseline;
  echo-stream    the same echo as a unary-stream RPC that yields one message
                 (Execute is server-streaming: this separates that cost);
  noop           Execute of the read-only `noop` tool, outcomes_only=True, one call
                 per request (durable journal on, as by default);
  noop-full      the same with outcomes_only=False (QUEUED, STARTED, FINISHED);
  write_file     Execute of write_file, 100 bytes to one file per client (atomic
                 write + fsync, durable journal);
  floor          the wire alone: a servicer in the echo's process that decodes the
                 ExecuteRequest and streams back one canned FINISHED event of a
                 no-op (no validation, policy, journal, task): the least any grpc.aio
                 server of this API costs, so what execgate itself adds is
                 noop - floor;
  floor-batch    the same as a unary ExecuteBatch.

Every case goes through the same client driver (one asyncio process; 32 tasks over
a few channels), is warmed up, then measured; the cases are interleaved over
several rounds and the median round value of each figure is reported, because the
machine is small and shared. Results also go to bench/results/dispatch.json.

The exit status reflects only breakage (a call that did not SUCCEED, an echo that
came back different, a server that died), never a time.

    python bench/dispatch.py            # the full run
    python bench/dispatch.py --quick    # a smoke run
    python bench/dispatch.py --profile  # also sample the daemon with py-spy (noop, 1 client)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/dispatch.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import psutil  # noqa: E402
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # noqa: E402

from bench import baseline  # noqa: E402
from execgate.client.wire import CHANNEL_OPTIONS  # noqa: E402
from execgate.executor.server.serve import MAX_MESSAGE  # noqa: E402
from execgate.v1 import executor_pb2 as pb  # noqa: E402
from execgate.v1 import executor_pb2_grpc as pb_grpc  # noqa: E402
from tests.daemon import Daemon  # noqa: E402

ECHO_METHOD = "/bench.Echo/Echo"
ECHO_STREAM_METHOD = "/bench.Echo/EchoStream"
FLOOR_METHOD = "/bench.Floor/Execute"
FLOOR_BATCH_METHOD = "/bench.Floor/ExecuteBatch"
RUN_ID = "bench"
NOOP_ARGS = json.dumps({"echo": "hello"})
WRITE_CONTENT = ("execgate bench " * 8)[:99] + "\n"  # 100 bytes
RPC_TIMEOUT = 60.0
# Issue 19's goals: (case, clients, figure, limit). p50: at most `limit` x echo's p50;
# throughput: at least `limit` x echo's calls/s.
GOALS = (
    ("noop-batch", 1, "p50", 1.5),
    ("noop", 1, "p50", 1.8),
    ("noop", 32, "throughput", 0.6),
    ("noop-batch", 32, "throughput", 0.6),
    ("write_file", 1, "p50", 3.0),
)
# Issue 19, the durable write path: write_file's calls/s at 32 clients (32 files) at
# least 2x what it was before. "Before" is the daemon at --base when given (what to trust
# on a busy machine); otherwise write_file's 32-client throughput as a share of echo's
# before the change, on a quiet machine (the README's table: 473 calls/s against echo's
# 3545), times echo now.
WRITE_THROUGHPUT_FACTOR = 2.0
WRITE_THROUGHPUT_BEFORE_X_ECHO = 0.13
RESULTS = ROOT / "bench" / "results" / "dispatch.json"


class BenchError(Exception):
    """Something broke (not: something was slow)."""


# ------------------------------------------------------------------ the echo server


def echo_server_options() -> list[tuple[str, int]]:
    # The options executor/server/serve.py `_server` gives the daemon's grpc.aio server.
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.so_reuseport", 0),
    ]


async def _serve_echo(address: str) -> None:
    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def echo_stream(request: bytes, context: grpc.aio.ServicerContext) -> Any:
        yield request

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            # No (de)serializers: the handlers see and return raw bytes.
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "EchoStream": grpc.unary_stream_rpc_method_handler(echo_stream),
        },
    )
    server = grpc.aio.server(options=echo_server_options())
    server.add_generic_rpc_handlers((handler, _floor_handler()))
    health_servicer = health.aio.HealthServicer()  # readiness, as the daemon has
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_insecure_port(address)
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(grace=1)


def _floor_handler() -> grpc.GenericRpcHandler:
    """Execute and ExecuteBatch as the wire alone: the request decoded, one canned
    FINISHED event of a no-op built with the call's id and the time, and encoded."""

    def finished(request: pb.ExecuteRequest) -> pb.ExecuteEvent:
        now = time.time()
        event = pb.ExecuteEvent(call_id=request.calls[0].call_id, batch_id="floor", index=0)
        event.time.FromNanoseconds(int(now * 1e9))
        o = event.finished.outcome
        o.status = pb.OUTCOME_STATUS_SUCCESS
        o.result.text, o.result.returned_bytes, o.result.total_bytes = "hello", 5, 5
        o.evidence.sandbox = "none"
        o.stopped_how = pb.STOP_MODE_COMPLETED
        for phase in ("QUEUED", "LOCK_GRANTED", "STARTED", "FINISHED"):
            o.timeline.add(phase=pb.Phase.Value(f"PHASE_{phase}")).at.FromNanoseconds(
                int(now * 1e9)
            )
        return event

    async def execute(request: pb.ExecuteRequest, context: grpc.aio.ServicerContext) -> Any:
        yield finished(request)

    async def execute_batch(
        request: pb.ExecuteRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExecuteResponse:
        return pb.ExecuteResponse(batch_id="floor", outcomes=[finished(request)])

    decode, event, response = (
        pb.ExecuteRequest.FromString,
        pb.ExecuteEvent.SerializeToString,
        pb.ExecuteResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(
        "bench.Floor",
        {
            "Execute": grpc.unary_stream_rpc_method_handler(execute, decode, event),
            "ExecuteBatch": grpc.unary_unary_rpc_method_handler(execute_batch, decode, response),
        },
    )


class EchoServer:
    """The echo server in a subprocess (this file, --serve-echo), on a Unix socket."""

    def __init__(self, root: Path) -> None:
        self.socket = root / "echo.sock"
        self.address = f"unix:{self.socket}"
        self.log_path = root / "echo.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> EchoServer:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--serve-echo", self.address],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(
                    f"echo server exited with {self.proc.returncode}:\n"
                    + self.log_path.read_text(errors="replace")
                )
            if self.socket.exists() and _serving(self.address):
                return self
            time.sleep(0.05)
        raise BenchError(f"echo server not serving after {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


# ------------------------------------------------------------------ the client driver


def channel_options() -> list[tuple[str, Any]]:
    # The client's own options, plus a private subchannel pool so that N channels to
    # one address really are N connections (by default gRPC would share one).
    return [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]


@dataclass
class Sample:
    """One measured batch of calls."""

    latencies_ns: list[int]
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float
    server_sys_s: float
    # CPU the whole machine spent meanwhile, beyond this process and the server: other
    # work on a shared machine (the other server idling counts too, a little).
    foreign_cpu_s: float
    # Per call, for Execute: (finished event, client send wall time, client receive wall time).
    traces: list[tuple[Any, float, float]] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return len(self.latencies_ns)


Prep = Callable[[int, int], Any]  # (client, seq) -> request
Invoke = Callable[[int, Any], Awaitable[Any]]  # (client, request) -> reply


async def drive(
    prep: Prep, invoke: Invoke, *, clients: int, count: int, server_pid: int, trace: bool = False
) -> Sample:
    """`count` calls from `clients` concurrent tasks, each call timed alone.

    The request is built outside the timed region; the reply is checked inside it
    (by `invoke`), as a real client would read it.
    """
    shares = [count // clients + (1 if c < count % clients else 0) for c in range(clients)]
    traces: list[tuple[Any, float, float]] = []

    async def worker(c: int) -> list[int]:
        out = []
        for i in range(shares[c]):
            request = prep(c, i)
            w0 = time.time()
            t0 = time.perf_counter_ns()
            reply = await invoke(c, request)
            t1 = time.perf_counter_ns()
            w1 = time.time()
            out.append(t1 - t0)
            if trace:
                traces.append((reply, w0, w1))
        return out

    server = psutil.Process(server_pid)
    m0 = _busy(psutil.cpu_times())
    s0 = server.cpu_times()
    c0 = time.process_time()
    t0 = time.perf_counter()
    per_client = await asyncio.gather(*(worker(c) for c in range(clients)))
    wall = time.perf_counter() - t0
    c1 = time.process_time()
    s1 = server.cpu_times()
    m1 = _busy(psutil.cpu_times())
    server_cpu = (s1.user + s1.system) - (s0.user + s0.system)
    return Sample(
        latencies_ns=[x for xs in per_client for x in xs],
        wall_s=wall,
        client_cpu_s=c1 - c0,
        server_cpu_s=server_cpu,
        server_sys_s=s1.system - s0.system,
        foreign_cpu_s=max(0.0, (m1 - m0) - (c1 - c0) - server_cpu),
        traces=traces,
    )


def _busy(t: Any) -> float:
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))


# ------------------------------------------------------------------ the cases


@dataclass(frozen=True)
class Case:
    name: str
    target: str  # "echo", "daemon", or "base" (the daemon at --base REV)
    description: str
    # What is sent (a CASES name); "" for the case's own name.
    kind: str = ""

    @property
    def what(self) -> str:
        return self.kind or self.name

    def at_base(self) -> Case:
        """The same case against the daemon at --base."""
        return Case(f"{self.name}@base", "base", f"{self.description} (--base)", self.what)


CASES = (
    Case("echo", "echo", "bare grpc.aio unary echo (baseline)"),
    Case("echo-stream", "echo", "bare grpc.aio unary-stream echo, one message"),
    Case("noop", "daemon", "Execute noop, outcomes_only=True"),
    Case("noop-full", "daemon", "Execute noop, outcomes_only=False (3 events)"),
    Case("write_file", "daemon", "Execute write_file, 100 B, own file per client"),
)
# Measured too when the daemon's proto has it: the same noop call over the unary RPC.
BATCH_CASE = Case("noop-batch", "daemon", "ExecuteBatch noop (unary), one call")
if "ExecuteBatch" in pb.DESCRIPTOR.services_by_name["Executor"].methods_by_name:
    CASES = (*CASES[:4], BATCH_CASE, *CASES[4:])
# The wire alone, served by the echo's process (see the module's docstring).
CASES = (
    *CASES,
    Case("floor", "echo", "the wire alone: Execute decoded, one canned event (stream)"),
    Case("floor-batch", "echo", "the wire alone: ExecuteBatch decoded, one canned reply"),
)


def noop_request(call_id: str, *, outcomes_only: bool) -> pb.ExecuteRequest:
    return pb.ExecuteRequest(
        run_id=RUN_ID,
        outcomes_only=outcomes_only,
        calls=[pb.ToolCall(call_id=call_id, tool="noop", arguments_json=NOOP_ARGS)],
    )


def echo_payload() -> bytes:
    # Raw bytes the size of a noop ExecuteRequest as this bench sends it.
    return noop_request("noop-r0-c1-m-00-000000", outcomes_only=True).SerializeToString()


class Targets:
    """Addresses and pids of the servers."""

    def __init__(self, echo: EchoServer, daemon: Daemon, base: Daemon | None = None) -> None:
        self.echo = echo
        self.daemon = daemon
        self.base = base

    def _server(self, case: Case) -> EchoServer | Daemon:
        if case.target == "base":
            assert self.base is not None
            return self.base
        return self.echo if case.target == "echo" else self.daemon

    def address(self, case: Case) -> str:
        return self._server(case).address

    def pid(self, case: Case) -> int:
        proc = self._server(case).proc
        assert proc is not None
        if proc.poll() is not None:
            raise BenchError(f"the {case.target} server died (exit {proc.returncode})")
        return proc.pid


def make_calls(case: Case, channels: Sequence[grpc.aio.Channel], tag: str) -> tuple[Prep, Invoke]:
    """The request builder and the invoker of one case, over the given channels."""
    n = len(channels)
    if case.what.startswith("floor"):
        return _floor_calls(case, channels, tag)
    if case.target == "echo":
        payload = echo_payload()
        method = ECHO_METHOD if case.what == "echo" else ECHO_STREAM_METHOD

        def prep_echo(c: int, i: int) -> bytes:
            return payload

        if case.what == "echo":
            unary = [
                ch.unary_unary(method, request_serializer=None, response_deserializer=None)
                for ch in channels
            ]

            async def invoke_echo(c: int, request: bytes) -> bytes:
                reply = await unary[c % n](request, timeout=RPC_TIMEOUT)
                if reply != request:
                    raise BenchError("echo came back different")
                return request

            return prep_echo, invoke_echo

        streams = [
            ch.unary_stream(method, request_serializer=None, response_deserializer=None)
            for ch in channels
        ]

        async def invoke_echo_stream(c: int, request: bytes) -> bytes:
            replies = [r async for r in streams[c % n](request, timeout=RPC_TIMEOUT)]
            if replies != [request]:
                raise BenchError("echo stream came back different")
            return request

        return prep_echo, invoke_echo_stream

    stubs = [pb_grpc.ExecutorStub(ch) for ch in channels]
    outcomes_only = case.what != "noop-full"
    expected_events = 1 if outcomes_only else 3

    if case.what == "write_file":
        args = [
            json.dumps({"path": f"bench/w{c:02d}.txt", "content": WRITE_CONTENT}) for c in range(64)
        ]

        def prep(c: int, i: int) -> pb.ExecuteRequest:
            return pb.ExecuteRequest(
                run_id=RUN_ID,
                outcomes_only=True,
                calls=[
                    pb.ToolCall(
                        call_id=f"{tag}-{c:02d}-{i:06d}",
                        tool="write_file",
                        arguments_json=args[c % len(args)],
                    )
                ],
            )
    else:

        def prep(c: int, i: int) -> pb.ExecuteRequest:
            return noop_request(f"{tag}-{c:02d}-{i:06d}", outcomes_only=outcomes_only)

    async def invoke(c: int, request: pb.ExecuteRequest) -> pb.ExecuteEvent:
        if case.what == BATCH_CASE.name:
            reply = await stubs[c % n].ExecuteBatch(request, timeout=RPC_TIMEOUT)
            events = list(reply.outcomes)
        else:
            events = [e async for e in stubs[c % n].Execute(request, timeout=RPC_TIMEOUT)]
        call_id = request.calls[0].call_id
        last = events[-1] if events else None
        if (
            len(events) != expected_events
            or last is None
            or not last.HasField("finished")
            or last.call_id != call_id
        ):
            raise BenchError(f"{case.name}: call {call_id}: unexpected events {events!r}")
        outcome = last.finished.outcome
        if outcome.status != pb.OUTCOME_STATUS_SUCCESS:
            raise BenchError(
                f"{case.name}: call {call_id} did not succeed: "
                f"{pb.OutcomeStatus.Name(outcome.status)} "
                f"{pb.ErrorClass.Name(outcome.error_class)}: {outcome.message}"
            )
        return last

    return prep, invoke


def _floor_calls(case: Case, channels: Sequence[grpc.aio.Channel], tag: str) -> tuple[Prep, Invoke]:
    n = len(channels)
    decode_event, decode_reply = pb.ExecuteEvent.FromString, pb.ExecuteResponse.FromString
    encode = pb.ExecuteRequest.SerializeToString
    stream = [ch.unary_stream(FLOOR_METHOD, encode, decode_event) for ch in channels]
    unary = [ch.unary_unary(FLOOR_BATCH_METHOD, encode, decode_reply) for ch in channels]

    def prep(c: int, i: int) -> pb.ExecuteRequest:
        return noop_request(f"{tag}-{c:02d}-{i:06d}", outcomes_only=True)

    async def invoke(c: int, request: pb.ExecuteRequest) -> pb.ExecuteEvent:
        if case.name == "floor-batch":
            events = list((await unary[c % n](request, timeout=RPC_TIMEOUT)).outcomes)
        else:
            events = [e async for e in stream[c % n](request, timeout=RPC_TIMEOUT)]
        if len(events) != 1 or events[0].call_id != request.calls[0].call_id:
            raise BenchError(f"{case.name}: unexpected events {events!r}")
        return events[0]

    return prep, invoke


async def run_case(
    case: Case, targets: Targets, *, clients: int, channels: int, warmup: int, count: int, tag: str
) -> Sample:
    address = targets.address(case)
    chans = [
        grpc.aio.insecure_channel(address, options=channel_options())
        for _ in range(max(1, min(channels, clients)))
    ]
    try:
        for ch in chans:
            await asyncio.wait_for(ch.channel_ready(), 20)
        trace = case.target in ("daemon", "base")
        prep, invoke = make_calls(case, chans, f"{tag}-w")
        await drive(prep, invoke, clients=clients, count=warmup, server_pid=targets.pid(case))
        prep, invoke = make_calls(case, chans, f"{tag}-m")
        return await drive(
            prep, invoke, clients=clients, count=count, server_pid=targets.pid(case), trace=trace
        )
    finally:
        for ch in chans:
            await ch.close()


# ------------------------------------------------------------------ statistics


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    k = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[k]


def summarize(sample: Sample) -> dict[str, float]:
    lat = sorted(sample.latencies_ns)
    return {
        "calls": sample.calls,
        "p50_ms": percentile(lat, 0.50) / 1e6,
        "p99_ms": percentile(lat, 0.99) / 1e6,
        "mean_ms": statistics.fmean(lat) / 1e6,
        "calls_per_s": sample.calls / sample.wall_s,
        "client_cpu_us_per_call": sample.client_cpu_s / sample.calls * 1e6,
        "server_cpu_us_per_call": sample.server_cpu_s / sample.calls * 1e6,
        "server_sys_us_per_call": sample.server_sys_s / sample.calls * 1e6,
        # Cores' worth of CPU used by others during the sample (noise indicator).
        "foreign_cores": sample.foreign_cpu_s / sample.wall_s,
    }


SEGMENTS = (
    ("in", "client send -> QUEUED mark (gRPC in, servicer, call task starts)"),
    ("admit", "QUEUED -> LOCK_GRANTED (validation, policy, workspace lock wait)"),
    # write_file's intent overlaps its staging (docs/architecture.md): inside `tool`.
    ("intent", "LOCK_GRANTED -> STARTED (journal intent; write_file's is inside `tool`)"),
    ("tool", "STARTED -> FINISHED mark (the tool itself)"),
    ("outcome", "FINISHED mark -> FINISHED event (journal outcome)"),
    ("out", "FINISHED event -> client has it (wire.event, gRPC out, client)"),
)


def breakdown(traces: list[tuple[Any, float, float]]) -> dict[str, float]:
    """Median ms between the marks of a call's timeline, the event time and the client.

    Daemon and client read the same wall clock (one machine), so the segments add up
    to the client's latency. What runs inside a segment is whatever dispatch.py does
    between those marks; the descriptions in SEGMENTS say what it does as written now.
    """
    per: dict[str, list[float]] = collections.defaultdict(list)
    for event, w0, w1 in traces:
        marks = {
            pb.Phase.Name(m.phase): m.at.ToNanoseconds() / 1e9
            for m in event.finished.outcome.timeline
        }
        queued, granted = marks["PHASE_QUEUED"], marks["PHASE_LOCK_GRANTED"]
        started, finished = marks["PHASE_STARTED"], marks["PHASE_FINISHED"]
        emitted = event.time.ToNanoseconds() / 1e9
        for name, value in (
            ("in", queued - w0),
            ("admit", granted - queued),
            ("intent", started - granted),
            ("tool", finished - started),
            ("outcome", emitted - finished),
            ("out", w1 - emitted),
            ("total", w1 - w0),
        ):
            per[name].append(value * 1e3)
    return {name: statistics.median(values) for name, values in per.items()}


def median_of_rounds(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


# ------------------------------------------------------------------ the run


@contextlib.contextmanager
def servers(root: Path, base_env: dict[str, str] | None = None) -> Iterator[Targets]:
    echo = EchoServer(root)
    daemons = [Daemon(root / "daemon")]
    if base_env is not None:  # the daemon at --base, beside this tree's
        daemons.append(Daemon(root / "base", env=base_env))
    try:
        echo.start()
        for daemon in daemons:
            daemon.root.mkdir()
            daemon.start()
        yield Targets(echo, *daemons)
    finally:
        echo.stop()
        for daemon in daemons:
            if daemon.proc is not None and daemon.proc.poll() is None:
                try:
                    daemon.stop()
                except subprocess.TimeoutExpired:
                    daemon.kill()


def selected(args: argparse.Namespace) -> tuple[Case, ...]:
    """The cases to run: --cases (echo always: every ratio is against it), and each
    daemon case once more against the daemon at --base."""
    cases = tuple(c for c in CASES if c.name == "echo" or not args.cases or c.name in args.cases)
    if args.base:
        cases += tuple(c.at_base() for c in cases if c.target == "daemon")
    return cases


async def measure(targets: Targets, args: argparse.Namespace) -> dict[str, Any]:
    concurrencies = (1, 32)
    counts = {1: args.count1, 32: args.count32}
    rounds: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    phases: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    cases = selected(args)
    for r in range(args.rounds):
        for clients in concurrencies:
            shift = r % len(cases)  # rotate the order: drift does not always hit one case
            for case in cases[shift:] + cases[:shift]:
                sample = await run_case(
                    case,
                    targets,
                    clients=clients,
                    channels=args.channels,
                    warmup=args.warmup,
                    count=counts[clients],
                    tag=f"{case.name}-r{r}-c{clients}",
                )
                key = f"{case.name}/{clients}"
                rounds[key].append(summarize(sample))
                if sample.traces:
                    phases[key].append(breakdown(sample.traces))
                s = rounds[key][-1]
                print(
                    f"  round {r + 1}/{args.rounds}  {case.name:<16} {clients:>2} clients  "
                    f"p50 {s['p50_ms']:7.3f} ms  p99 {s['p99_ms']:7.3f} ms  "
                    f"{s['calls_per_s']:8.0f} calls/s  others {s['foreign_cores']:4.2f} cores",
                    flush=True,
                )
    rows = []
    for clients in concurrencies:
        echo = median_of_rounds(rounds[f"echo/{clients}"])
        for case in cases:
            key = f"{case.name}/{clients}"
            m = median_of_rounds(rounds[key])
            rows.append(
                {
                    "case": case.name,
                    "description": case.description,
                    "clients": clients,
                    **m,
                    "p50_ratio_vs_echo": m["p50_ms"] / echo["p50_ms"],
                    "throughput_ratio_vs_echo": m["calls_per_s"] / echo["calls_per_s"],
                    "phases_ms": median_of_rounds(phases[key]) if key in phases else None,
                    "rounds": rounds[key],
                }
            )
    return {"rows": rows}


def goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each goal with its measured ratio, and the floor's (the wire alone) beside it:
    a goal the floor itself misses is out of reach for any grpc.aio servicer."""
    by = {(row["case"], row["clients"]): row for row in rows}
    out = []
    for case, clients, figure, limit in GOALS:
        row = by.get((case, clients))
        if row is None:
            continue
        key = "p50_ratio_vs_echo" if figure == "p50" else "throughput_ratio_vs_echo"
        ratio = row[key]
        floor_case = {"noop": "floor", "noop-batch": "floor-batch"}.get(case, "")
        floor = by.get((floor_case, clients))
        out.append(
            {
                "case": case,
                "clients": clients,
                "figure": figure,
                "limit": limit,
                "ratio": ratio,
                "floor_ratio": floor[key] if floor is not None else None,
                "met": ratio <= limit if figure == "p50" else ratio >= limit,
            }
        )
    if ("write_file", 32) in by:
        out.append(write_throughput_goal(by["write_file", 32], by.get(("write_file@base", 32))))
    return out


def write_throughput_goal(row: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """write_file at 32 clients against its throughput before (see WRITE_THROUGHPUT_*)."""
    if base is not None:
        ratio, before = row["calls_per_s"] / base["calls_per_s"], "the --base daemon's"
    else:
        ratio = row["throughput_ratio_vs_echo"] / WRITE_THROUGHPUT_BEFORE_X_ECHO
        before = f"before ({WRITE_THROUGHPUT_BEFORE_X_ECHO}x echo's, quiet machine)"
    return {
        "text": f"write_file 32 clients: calls/s {ratio:.2f}x {before} "
        f"(goal >= {WRITE_THROUGHPUT_FACTOR}x)",
        "met": ratio >= WRITE_THROUGHPUT_FACTOR,
    }


def print_report(result: dict[str, Any]) -> None:
    rows = result["rows"]
    print()
    print(
        f"{'case':<16} {'clients':>7} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>9} "
        f"{'p50 x echo':>10} {'tput x echo':>11}"
    )
    for row in rows:
        print(
            f"{row['case']:<16} {row['clients']:>7} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} "
            f"{row['calls_per_s']:>9.0f} {row['p50_ratio_vs_echo']:>10.2f} "
            f"{row['throughput_ratio_vs_echo']:>11.2f}"
        )
    print()
    print(
        "CPU per call (us, median round): the client process; the server process "
        "(all threads, of which kernel)"
    )
    for row in rows:
        print(
            f"  {row['case']:<16} {row['clients']:>2} clients  "
            f"client {row['client_cpu_us_per_call']:6.0f}   "
            f"server {row['server_cpu_us_per_call']:6.0f} "
            f"(sys {row['server_sys_us_per_call']:4.0f})"
        )
    foreign = [r["foreign_cores"] for row in rows for r in row["rounds"]]
    print(
        f"  other processes on the machine during the samples: median "
        f"{statistics.median(foreign):.2f}, max {max(foreign):.2f} cores of {os.cpu_count()}"
        + ("  (noisy: compare with care)" if max(foreign) > 0.25 else "")
    )
    print()
    print(
        "Where an Execute call's time goes (median ms per segment, median round; "
        "medians need not add up):"
    )
    names = [n for n, _ in SEGMENTS]
    print(f"  {'case':<16} {'clients':>7} " + " ".join(f"{n:>8}" for n in names) + f" {'total':>8}")
    for row in rows:
        ph = row["phases_ms"]
        if ph:
            print(
                f"  {row['case']:<16} {row['clients']:>7} "
                + " ".join(f"{ph[n]:>8.3f}" for n in names)
                + f" {ph['total']:>8.3f}"
            )
    for name, text in SEGMENTS:
        print(f"    {name:<8} {text}")
    print()
    print("Goals (against echo at the same concurrency, or the --base daemon; floor: the wire")
    print("alone, same figure):")
    for g in result["goals"]:
        verdict = "MET" if g["met"] else "NOT MET"
        if "text" in g:
            print(f"  {g['text']}  {verdict}")
            continue
        bound = "<=" if g["figure"] == "p50" else ">="
        floor = f"  (floor {g['floor_ratio']:.2f}x)" if g["floor_ratio"] is not None else ""
        print(
            f"  {g['case']:<10} {g['clients']:>2} clients: {g['figure']} {g['ratio']:.2f}x echo "
            f"(goal {bound} {g['limit']}x)  {verdict}{floor}"
        )


async def run_all(targets: Targets, args: argparse.Namespace) -> dict[str, Any]:
    # One event loop for everything: grpc.aio is happiest that way.
    result = await measure(targets, args)
    result["goals"] = goals(result["rows"])
    result["config"] = {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "serve_echo"
    }
    print_report(result)
    if args.profile:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result["profile"] = await profile_noop(targets, args.profile_seconds, args.json.parent)
    return result


def environment(tmp: Path) -> dict[str, Any]:
    fs = "?"
    best = ""
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        for line in mounts:
            parts = line.split()
            if len(parts) > 2 and str(tmp).startswith(parts[1]) and len(parts[1]) >= len(best):
                best, fs = parts[1], parts[2]

    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *cmd], capture_output=True, text=True, check=False
        ).stdout.rstrip()

    rev = git("rev-parse", "--short", "HEAD")
    dirty = [
        line[3:]
        for line in git("status", "--porcelain", "--", "executor", "client", "proto").splitlines()
    ]
    return {
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "git": rev,
        # The daemon measured is the work tree: its uncommitted changes, and a digest of them.
        "uncommitted": dirty,
        "uncommitted_diff_sha256": hashlib.sha256(
            git("diff", "HEAD", "--", "executor", "client", "proto").encode()
        ).hexdigest()[:16],
        "tmp": str(tmp),
        "tmp_fs": fs,
        "hostname": socket.gethostname(),
        "fsync_ms": fsync_probe(tmp),
    }


def fsync_probe(where: Path, count: int = 30) -> dict[str, float]:
    """What one fsync of a small write costs on the disk under `where` now (p50, p90 ms):
    a durable write_file waits for three of them in a row, so this says how far its
    latency is the disk's (other machines' load on a shared disk shows here first)."""
    times = []
    fd, name = tempfile.mkstemp(dir=where)
    try:
        for _ in range(count):
            os.write(fd, b"x" * 100)
            t0 = time.perf_counter()
            os.fsync(fd)
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        os.close(fd)
        os.unlink(name)
    times.sort()
    return {"p50": percentile(times, 0.5), "p90": percentile(times, 0.9)}


# ------------------------------------------------------------------ profiling (optional)


async def profile_noop(targets: Targets, seconds: float, out_dir: Path) -> dict[str, Any]:
    """py-spy the daemon while one client runs noop calls; summarize where the CPU goes.

    Sampled with --gil: only the thread holding the GIL is recorded, so waiting
    (epoll, the writer's queue, a GIL handoff) drops out and what is left is the
    Python-level CPU of the daemon. Cython (grpc.aio) and C code run inside an asyncio
    callback show up as own time of `Handle._run`.
    """
    # The venv's bin first: py-spy is usually pip-installed next to this interpreter.
    spy = shutil.which(
        "py-spy",
        path=os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
    )
    if spy is None:
        print("\nprofile: py-spy is not installed (pip install py-spy); skipped")
        return {}
    assert targets.daemon.proc is not None
    pid = targets.daemon.proc.pid
    raw = out_dir / "daemon-noop.pyspy.txt"
    rate = 1000
    case = next(c for c in CASES if c.name == "noop")
    chans = [grpc.aio.insecure_channel(targets.daemon.address, options=channel_options())]
    prep, invoke = make_calls(case, chans, "profile-warm")
    await drive(prep, invoke, clients=1, count=200, server_pid=pid)
    proc = await asyncio.create_subprocess_exec(
        spy,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(round(seconds)),
        "--rate",
        str(rate),
        "--gil",
        "--nonblocking",
        "--threads",
        "--format",
        "raw",
        "--output",
        str(raw),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    calls = 0
    while proc.returncode is None:
        prep, invoke = make_calls(case, chans, f"profile-{calls}")
        await drive(prep, invoke, clients=1, count=100, server_pid=pid)
        calls += 100
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.001)
    _, err = await proc.communicate()
    await chans[0].close()
    if proc.returncode != 0 or not raw.exists():
        print(f"\nprofile: py-spy failed: {err.decode(errors='replace')[-500:]}")
        return {}
    return summarize_profile(raw, calls=calls, possible=rate * seconds)


def summarize_profile(raw: Path, *, calls: int, possible: float, top: int = 20) -> dict[str, Any]:
    by_thread: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, tail = line.rpartition(" ")
        if not tail.isdigit():
            continue
        count = int(tail)
        thread, *frames = stack.split(";")
        total += count
        by_thread[thread.partition(": ")[2] or thread] += count
        if not frames:
            continue
        own[_function(frames[-1])] += count
        # Charged to the innermost daemon frame (executor/..., but not the cli's
        # asyncio.run at the bottom of every loop stack), library callees included.
        mine = next(
            (f for f in reversed(frames) if "(executor/" in f and "(executor/cli/" not in f),
            None,
        )
        if mine is None:
            ours["[loop] " + _function(frames[-1])] += count
            parts["event loop + grpc.aio (no daemon frame)"] += count
        else:
            ours[_function(mine)] += count
            module = mine.rpartition("(executor/")[2].partition(":")[0]
            parts[_component(module)] += count
    if not total:
        print("\nprofile: no samples")
        return {}
    print(
        f"\nprofile: py-spy --gil on the daemon, noop, 1 client: {calls} calls, {total} "
        f"samples with the GIL held = {total / possible:.0%} of wall time "
        f"(stacks: {raw})"
    )
    print("  GIL samples by thread:")
    for name, n in by_thread.most_common(6):
        print(f"    {n / total:6.1%}  {name}")
    print("  by component (module of the innermost daemon frame):")
    for name, n in parts.most_common():
        print(f"    {n / total:6.1%}  {name}")
    print("  by innermost daemon function (library callees included; [loop] = none):")
    for name, n in ours.most_common(top):
        print(f"    {n / total:6.1%}  {name}")
    print("  own time (leaf function):")
    for name, n in own.most_common(top):
        print(f"    {n / total:6.1%}  {name}")
    return {
        "samples": total,
        "gil_share": total / possible,
        "calls": calls,
        "raw": str(raw),
        "threads": {k: v / total for k, v in by_thread.most_common(10)},
        "components": {k: v / total for k, v in parts.most_common()},
        "by_daemon_function": {k: v / total for k, v in ours.most_common(60)},
        "own": {k: v / total for k, v in own.most_common(60)},
    }


# Module of the innermost daemon frame -> what it is part of (first match).
_COMPONENTS = (
    ("journal/", "journal (SQLite, writer thread, codec)"),
    ("telemetry/", "telemetry (spans, metrics, span export)"),
    ("pipeline/telemetry.py", "telemetry (spans, metrics, span export)"),
    ("server/wire", "protobuf conversion (server/wire*.py)"),
    ("server/auth.py", "edge (authentication, request guard)"),
    ("server/guard.py", "edge (authentication, request guard)"),
    ("server/", "servicers (server/)"),
    ("pipeline/validate.py", "validation (schema, paths, effects)"),
    ("tools/schemacheck.py", "validation (schema, paths, effects)"),
    ("tools/effects.py", "validation (schema, paths, effects)"),
    ("policy/", "policy (decide, limits, quotas)"),
    ("pipeline/authorize.py", "policy (decide, limits, quotas)"),
    ("locks/", "locks"),
    ("pipeline/", "dispatcher (pipeline/: tasks, events, scheduling, outcomes)"),
    ("core/", "dispatcher (pipeline/: tasks, events, scheduling, outcomes)"),
    ("tools/", "the tool"),
)


def _component(module: str) -> str:
    return next((name for prefix, name in _COMPONENTS if module.startswith(prefix)), module)


def _function(frame: str) -> str:
    """'fn (path/to/file.py:12)' -> 'fn (file.py)'."""
    name, _, where = frame.partition(" (")
    if not where:
        return frame
    return f"{name} ({where.rstrip(')').rsplit('/', 1)[-1].rpartition(':')[0]})"


# ------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a fast smoke run (small counts, 1 round)")
    p.add_argument("--warmup", type=int, help="warm-up calls per case (default 200)")
    p.add_argument("--count1", type=int, help="measured calls with 1 client (default 2000)")
    p.add_argument("--count32", type=int, help="measured calls with 32 clients (default 4000)")
    p.add_argument("--rounds", type=int, help="interleaved rounds; the median is reported (3)")
    p.add_argument("--channels", type=int, default=4, help="channels the 32 clients share (4)")
    p.add_argument(
        "--cases",
        type=lambda text: set(text.split(",")),
        default=set(),
        help="comma-separated cases to run (echo always runs; default: all)",
    )
    p.add_argument(
        "--base",
        metavar="REV",
        help="also measure the daemon at git revision REV, interleaved (before/after)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the measurements, sample the daemon with py-spy under noop load",
    )
    p.add_argument("--profile-seconds", type=float, default=10.0)
    p.add_argument("--json", type=Path, default=RESULTS, help=f"results file ({RESULTS})")
    p.add_argument(
        "--tmp",
        type=Path,
        default=None,
        help="where the servers' sockets, journal and workspace go (a temp dir)",
    )
    p.add_argument("--serve-echo", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = {"warmup": 50, "count1": 200, "count32": 400, "rounds": 1}
    full = {"warmup": 200, "count1": 2000, "count32": 4000, "rounds": 3}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_echo:
        asyncio.run(_serve_echo(args.serve_echo))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="eg-bench-", dir=args.tmp))
    env = environment(tmp)
    base_env = None
    if args.base:
        try:
            base_env = baseline.export(args.base, tmp / "base-tree")
        except baseline.BaselineError as exc:
            print(f"bench: --base {args.base}: {exc}", file=sys.stderr)
            return 2
        env["base"] = baseline.describe(args.base)
    print(
        f"execgate dispatch bench: {env['cpus']} cpus, load {env['loadavg_at_start']}, "
        f"python {env['python']}, grpcio {env['grpcio']}, tmp on {env['tmp_fs']}, "
        f"fsync p50 {env['fsync_ms']['p50']:.2f} ms p90 {env['fsync_ms']['p90']:.2f} ms"
    )
    print(
        f"warmup {args.warmup}, measured {args.count1} (1 client) / {args.count32} "
        f"(32 clients over {args.channels} channels), {args.rounds} round(s); "
        f"echo payload {len(echo_payload())} bytes"
    )
    try:
        with servers(tmp, base_env) as targets:
            result = asyncio.run(run_all(targets, args))
            result["environment"] = env
    except BenchError as exc:
        print(f"\nbench: FAILED: {exc}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:
        print(f"\nbench: FAILED: RPC error: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nresults: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
