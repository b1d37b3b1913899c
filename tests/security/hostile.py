"""A hostile client: the bad-input corpus, sent round after round to a real daemon.

Reusable by any test or benchmark that needs a daemon under hostile load (issue 13:
the daemon's memory after the corpus). One `Hostile.round()` sends every class once,
with names never used before, so that anything the daemon keeps per name shows up
as growth:

    bogus_tools     calls of tools that do not exist, long distinct names
    distinct_ids    fresh run ids, call ids, batch ids and idempotency keys
    huge_arguments  arguments just under the daemon's arguments cap
    big_outputs     commands printing near the output cap and past the raw cap
    malformed       bad JSON, deep JSON, schema violations, path escapes, over-long ids,
                    undecodable protobuf bytes, bogus page tokens and filters
    denied          calls the policy denies (secrets), and `ask` calls whose client
                    walks away while they await approval
    cancelled       running and queued calls cancelled with long reasons; streams
                    dropped mid-call
    runs            runs started, moved, cancelled, read
    watches         WatchRun and Approvals.Watch streams opened and dropped
    bogus_tokens    RPCs with distinct made-up bearer tokens (refused where the daemon
                    has an identities file)

With several `agents` (each the metadata of one identity's token), round i speaks as
agent i mod n: the daemon sees many agent ids, each with its runs and calls.

Every RPC's failure is expected and counted (`tally`); the driver fails only if the
daemon stops answering. It talks raw gRPC (the generated stubs), so it can send what
the client library would refuse to build.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import psutil

from execgate.v1 import executor_pb2 as pb
from execgate.v1 import executor_pb2_grpc as pb_grpc
from execgate.v1 import runs_pb2 as rpb
from execgate.v1 import runs_pb2_grpc as rpb_grpc

MIB = 1 << 20
# The policy a hostile daemon runs (tests/security/test_memory_bound.py): the shipped
# default's shape, plus an `ask` rule for `asked/` so that approvals are exercised.
POLICY = """\
version: 1
default: deny
rules:
  - {id: secrets, effect: deny, paths: ["**/.env", "**/*.pem"], reason: secrets}
  - {id: asked, effect: ask, tools: [write_file], paths: ["asked/**"], approvers: [approver],
     ttl: 600, reason: needs a human}
  - {id: reads, effect: allow, tools: [read_file, list_dir, search], reason: reads}
  - {id: writes, effect: allow, tools: [write_file, edit_file], reason: writes}
  - {id: commands, effect: allow, tools: [run_command], reason: commands}
  - {id: probes, effect: allow, tools: [noop, work], reason: probes}
"""


@dataclass(frozen=True, slots=True)
class Shape:
    """How much of each class one round sends."""

    bogus_tools: int = 40
    distinct_ids: int = 40
    huge_arguments: int = 2
    big_outputs: int = 2
    runs: int = 8
    watches: int = 6
    cancels: int = 3


def rss(pid: int) -> int:
    """Resident set size of process `pid`, in bytes."""
    return int(psutil.Process(pid).memory_info().rss)


class Hostile:
    """The corpus against the daemon at `address`; `round()` sends one of each class."""

    def __init__(
        self,
        address: str,
        *,
        shape: Shape | None = None,
        agents: Sequence[tuple[tuple[str, str], ...]] = ((),),
        workers: int = 4,
    ) -> None:
        self.shape = shape or Shape()
        self.tally: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._agents = list(agents)
        self._rounds = 0
        self._md = self._agents[0]
        self._channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", 64 * MIB),
                ("grpc.max_receive_message_length", 64 * MIB),
            ],
        )
        self._ex = pb_grpc.ExecutorStub(self._channel)
        self._ap = pb_grpc.ApprovalsStub(self._channel)
        self._runs = rpb_grpc.RunsStub(self._channel)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="hostile")
        self._seq = itertools.count()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._channel.close()

    def __enter__(self) -> Hostile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rounds --------------------------------------------------------------------

    def round(self) -> None:
        """Every class once, concurrently; returns when all their RPCs have ended."""
        self._md = self._agents[self._rounds % len(self._agents)]
        self._rounds += 1
        classes: list[Callable[[], None]] = [
            self.bogus_tools,
            self.distinct_ids,
            self.huge_arguments,
            self.big_outputs,
            self.malformed,
            self.denied,
            self.cancelled,
            self.runs,
            self.watches,
            self.bogus_tokens,
        ]
        for done in [self._pool.submit(c) for c in classes]:
            done.result()

    def rounds(self, n: int) -> None:
        for _ in range(n):
            self.round()

    # -- the classes ---------------------------------------------------------------

    def bogus_tools(self) -> None:
        calls = [
            _call(f"no_such_tool_{self._uid()}_" + "x" * 200, {"a": 1})
            for _ in range(self.shape.bogus_tools)
        ]
        self._batch(calls, "bogus_tools", run_id=self._uid())

    def distinct_ids(self) -> None:
        for chunk in range(4):
            calls = [
                _call("noop", {"echo": self._uid()}, call_id=self._uid(), key=self._uid())
                for _ in range(self.shape.distinct_ids // 4)
            ]
            self._batch(calls, "distinct_ids", run_id=f"run_{self._uid()}_{chunk}")

    def huge_arguments(self) -> None:
        # Just under the default 4 MiB arguments cap; the echo comes back truncated.
        echo = "h" * (4 * MIB - 64 * 1024)
        for _ in range(self.shape.huge_arguments):
            self._batch([_call("noop", {"echo": echo})], "huge_arguments")
        self._batch([_call("noop", {"echo": echo + "h" * (80 * 1024)})], "huge_arguments")

    def big_outputs(self) -> None:
        script = "head -c {n} /dev/zero | tr '\\0' o; head -c {n} /dev/zero | tr '\\0' e >&2"
        sizes = (60 * 1024, 3 * MIB // 2)  # near the output cap; past the raw cap
        for _ in range(self.shape.big_outputs):
            calls = [
                _call("run_command", {"argv": ["sh", "-c", script.format(n=n)]}) for n in sizes
            ]
            self._batch(calls, "big_outputs")

    def malformed(self) -> None:
        deep = "[" * 100_000 + "]" * 100_000
        bad: list[pb.ToolCall] = [
            pb.ToolCall(call_id=self._uid(), tool="noop", arguments_json="{not json"),
            pb.ToolCall(call_id=self._uid(), tool="noop", arguments_json='{"echo": ' + deep + "}"),
            pb.ToolCall(call_id=self._uid(), tool="noop", arguments_json="[1, 2]"),
            _call("read_file", {"path": "../../etc/passwd"}),
            _call("read_file", {"path": "a/" * 3000}),
            _call("read_file", {"path": 7}),
            _call("write_file", {"path": "x", "content": "y", "bogus": self._uid()}),
            _call("noop", {"echo": "x"}, call_id="c" * 300 + self._uid()),
            _call("noop", {"echo": "x"}, key="k" * 300 + self._uid()),
            _call("run_command", {"argv": []}),
            _call("search", {"pattern": "(" * 5000, "path": "."}),
        ]
        self._batch(bad, "malformed", run_id=self._uid())
        self._batch([_call("noop", {})], "malformed", run_id="r" * 300 + self._uid())
        for method in ("Executor/Execute", "Executor/ExecuteBatch", "Executor/Cancel"):
            self._raw(f"/execgate.v1.{method}", b"\xff\xfe\x00garbage" + self._uid().encode())
        self._raw("/execgate.v1.Runs/StartRun", b"\x0a\xff\xff\xff\xff\x0f")
        self._rpc(self._ex.ListCalls, pb.ListCallsRequest(page_token=self._uid()), "malformed")
        self._rpc(self._ex.ListCalls, pb.ListCallsRequest(tool=self._uid(), limit=5), "malformed")
        self._rpc(self._ex.GetCall, pb.GetCallRequest(call_id=self._uid()), "malformed")
        self._rpc(self._ex.Explain, _request(bad[:4], run_id=self._uid()), "malformed")

    def denied(self) -> None:
        calls = [
            _call("read_file", {"path": f"{self._uid()}/.env"}),
            _call("write_file", {"path": f"{self._uid()}.pem", "content": "k"}),
            _call("read_file", {"path": "x"}, call_id=self._uid()),
        ]
        self._batch(calls, "denied", run_id=self._uid())
        # Parked by the `ask` rule, then its client walks away: the call is stopped.
        ask = _call("write_file", {"path": f"asked/{self._uid()}", "content": "a" * 4096})
        self._stream_and_drop(_request([ask], run_id=self._uid()), "denied", after=2)

    def cancelled(self) -> None:
        for _ in range(self.shape.cancels):
            run_id, target = self._uid(), f"c_{self._uid()}.txt"
            running = _call("work", {"path": target, "write": True, "seconds": 30})
            queued = _call("work", {"path": target, "write": True}, call_id=self._uid())
            batch = self._in_thread(
                lambda r=run_id, c=[running, queued]: self._batch(c, "cancelled", run_id=r)
            )
            reason = "stop " + self._uid() + " " + "r" * 32 * 1024
            self._cancel_when_running(run_id, running.call_id, reason)
            batch.join(60)
        # A stream dropped while its call runs: the call finishes and is recorded.
        short = _call("work", {"path": f"d_{self._uid()}", "seconds": 0.2})
        self._stream_and_drop(_request([short], run_id=self._uid()), "cancelled", after=2)

    def runs(self) -> None:
        for i in range(self.shape.runs):
            run_id = f"run_{self._uid()}"
            goal = "g" * 32 * 1024
            start = rpb.StartRunRequest(
                run_id=run_id, goal=goal, labels={self._uid(): "v" * 1024}, model=self._uid()
            )
            if not self._rpc(self._runs.StartRun, start, "runs"):
                continue
            event = rpb.RunEvent(
                seq=1,
                from_state="created",
                to_state="requesting_model",
                reason=self._uid(),
                data_json=json.dumps({"blob": "d" * 16 * 1024}),
            )
            self._rpc(
                self._runs.AppendEvents,
                rpb.AppendEventsRequest(run_id=run_id, events=[event]),
                "runs",
            )
            bad = rpb.RunEvent(seq=7, from_state="created", to_state="completed")
            self._rpc(
                self._runs.AppendEvents,
                rpb.AppendEventsRequest(run_id=run_id, events=[bad]),
                "runs",
            )
            self._step(run_id)
            if i % 2:  # a reason past the daemon's cap (refused), then one under it
                for reason in ("x" * 8192, "x" * 1000):
                    cancel = rpb.CancelRunRequest(run_id=run_id, reason=reason)
                    self._rpc(self._runs.CancelRun, cancel, "runs")
            self._rpc(self._runs.GetRun, rpb.GetRunRequest(run_id=run_id), "runs")
        self._rpc(self._runs.ListRuns, rpb.ListRunsRequest(limit=50), "runs")

    def _step(self, run_id: str) -> None:
        """A loop step with a big turn, then the same step again (a retry: recognised,
        answered from the record; its call joins or replays)."""
        opening = [
            rpb.RunEvent(
                seq=2,
                from_state="requesting_model",
                to_state="validating",
                data_json=json.dumps({"turn": "t" * 16 * 1024}),
            ),
            rpb.RunEvent(seq=3, from_state="validating", to_state="running_tools"),
        ]
        call = pb.ToolCall(
            call_id="s1c1", tool="noop", arguments_json="{}", idempotency_key=f"{run_id}:s1c1"
        )
        step = rpb.StepRequest(run_id=run_id, events=opening, calls=[call])
        for _ in range(2):
            self._rpc(self._runs.StepBatch, step, "runs")

    def watches(self) -> None:
        for _ in range(self.shape.watches):
            run_id = f"run_{self._uid()}"
            self._rpc(self._runs.StartRun, rpb.StartRunRequest(run_id=run_id), "watches")
            watch = self._runs.WatchRun(
                rpb.WatchRunRequest(run_id=run_id), metadata=self._md, timeout=30
            )
            self._drop(watch, after=0, what="watches")
            self._drop(
                self._ap.Watch(pb.WatchApprovalsRequest(), metadata=self._md, timeout=30),
                0,
                "watches",
            )
            missing = self._runs.WatchRun(
                rpb.WatchRunRequest(run_id=self._uid()), metadata=self._md, timeout=30
            )
            self._drop(missing, after=1, what="watches")

    def bogus_tokens(self) -> None:
        for _ in range(self.shape.bogus_tools // 2):
            md = (("authorization", f"Bearer {self._uid()}{'t' * 64}"),)
            try:
                self._ex.ListTools(pb.ListToolsRequest(), metadata=md, timeout=30)
            except grpc.RpcError as exc:
                self._count("bogus_tokens", exc.code().name)
                _alive(exc)
            else:
                self._count("bogus_tokens", "ok")

    # -- plumbing --------------------------------------------------------------------

    def _uid(self) -> str:
        return f"{next(self._seq):x}{uuid.uuid4().hex[:10]}"

    def _count(self, what: str, result: str) -> None:
        with self._lock:
            self.tally[f"{what}:{result}"] += 1

    def _rpc(self, method: Any, request: Any, what: str) -> Any:
        try:
            reply = method(request, metadata=self._md, timeout=60)
        except grpc.RpcError as exc:
            self._count(what, exc.code().name)  # type: ignore[attr-defined]
            _alive(exc)
            return None
        self._count(what, "ok")
        return reply

    def _batch(self, calls: list[pb.ToolCall], what: str, run_id: str = "") -> None:
        reply = self._rpc(self._ex.ExecuteBatch, _request(calls, run_id=run_id), what)
        for event in reply.outcomes if reply is not None else ():
            status = pb.OutcomeStatus.Name(event.finished.outcome.status)
            self._count(what, status.removeprefix("OUTCOME_STATUS_"))

    def _raw(self, method: str, body: bytes) -> None:
        call = self._channel.unary_unary(
            method, request_serializer=None, response_deserializer=None
        )
        self._rpc(call, body, "malformed")

    def _stream_and_drop(self, request: pb.ExecuteRequest, what: str, after: int) -> None:
        self._drop(self._ex.Execute(request, metadata=self._md, timeout=60), after, what)

    def _drop(self, stream: Any, after: int, what: str) -> None:
        """Read `after` messages of a server stream, then walk away from it."""
        try:
            for _, _msg in zip(range(after), stream, strict=False):
                pass
            self._count(what, "dropped")
        except grpc.RpcError as exc:
            self._count(what, exc.code().name)
            _alive(exc)
        finally:
            stream.cancel()

    def _cancel_when_running(self, run_id: str, call_id: str, reason: str) -> None:
        """Cancel `call_id` once the daemon says it started (GetCall finds its intent):
        first with a reason past the daemon's cap (refused), then with one under it."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            probe = pb.GetCallRequest(run_id=run_id, call_id=call_id)
            if self._rpc(self._ex.GetCall, probe, "cancel_probe") is not None:
                break
            time.sleep(0.005)  # a poll interval: the deadline above bounds the wait
        for why in (reason, reason[:1000]):
            order = pb.CancelRequest(run_id=run_id, reason=why, requester=self._uid())
            self._rpc(self._ex.Cancel, order, "cancelled")

    def _in_thread(self, work: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        return thread


def _call(tool: str, args: dict[str, Any], *, call_id: str = "", key: str = "") -> pb.ToolCall:
    return pb.ToolCall(
        call_id=call_id or f"call_{uuid.uuid4().hex}",
        tool=tool,
        arguments_json=json.dumps(args),
        idempotency_key=key,
    )


def _request(calls: list[pb.ToolCall], *, run_id: str = "") -> pb.ExecuteRequest:
    return pb.ExecuteRequest(run_id=run_id, calls=calls)


_DEAD = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN}


def _alive(exc: grpc.RpcError) -> None:
    """A refusal is expected; a daemon that stopped answering is not."""
    code = exc.code()  # type: ignore[attr-defined]
    if code in _DEAD and "Socket closed" in str(exc.details()):  # type: ignore[attr-defined]
        raise AssertionError(f"the daemon stopped answering: {exc}") from exc
