"""The daemon's memory under the hostile corpus stays bounded (issue 13).

A real daemon (the hostile policy, OTLP traces and metrics exported to a sink, so
every telemetry path is live) takes the corpus of tests/security/hostile.py round
after round: distinct bogus tool names, ids, runs, huge arguments, outputs past the
caps, malformed and denied calls, cancels, dropped streams. Its RSS is sampled at
start, after a warm-up, after N rounds and after 2N rounds.

Python's allocator keeps freed arenas, so RSS is judged at steady state: 2N rounds
may not hold more than N rounds did, beyond a small margin; and the whole run may
not cost more than a fixed allowance over the idle daemon (the daemon grew from
~70 MiB to 430 MiB in the probe that filed the issue). Bounded in `make test`; 10x
the rounds under `make fuzz` (tests/security/budget.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from execgate.executor.server.services import MAX_REASON_CHARS
from execgate.v1 import executor_pb2 as pb
from execgate.v1 import executor_pb2_grpc as pb_grpc
from execgate.v1 import runs_pb2 as rpb
from execgate.v1 import runs_pb2_grpc as rpb_grpc
from tests.auth_support import Who, write_identities
from tests.daemon import Daemon
from tests.security.budget import race_rounds
from tests.security.hostile import MIB, POLICY, Hostile, rss
from tests.security.sink import OtlpSink

# Agents the corpus speaks as, one per round (agent ids are the identities'
# names: a client cannot make up more, only present bogus tokens, which it also does).
AGENTS = [Who(f"agent{i}", ("agent", "operator"), token=f"tok-{i}-" + "a" * 40) for i in range(3)]
WARMUP = 2
N = race_rounds(4)
# RSS growth allowed from N to 2N rounds (steady state: noise, not a holder).
STEADY_MARGIN = 8 * MIB
# RSS growth allowed over the idle daemon for the whole run (warm-up included).
TOTAL_ALLOWANCE = 40 * MIB


@pytest.fixture(scope="module")
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, sink: OtlpSink) -> Iterator[Daemon]:
    root: Path = tmp_path_factory.mktemp("memory")
    (root / "policy.yaml").write_text(POLICY)
    people = write_identities(root / "identities.yaml", AGENTS)
    args = ("--policy", str(root / "policy.yaml"), "--identities", str(people))
    d = Daemon(root, *args, env=sink.env(interval_ms=500))
    d.start()
    yield d
    d.stop()


def test_rss_reaches_a_steady_state_under_the_hostile_corpus(
    daemon: Daemon, sink: OtlpSink
) -> None:
    assert daemon.proc is not None
    pid = daemon.proc.pid
    figures = {"initial": rss(pid)}
    with Hostile(daemon.address, agents=[_md(a) for a in AGENTS]) as hostile:
        hostile.rounds(WARMUP)
        figures["warm-up"] = rss(pid)
        hostile.rounds(N)
        figures["N"] = rss(pid)
        hostile.rounds(N)
        figures["2N"] = rss(pid)
        tally = hostile.tally
    shown = ", ".join(f"{k}={v / MIB:.1f} MiB" for k, v in figures.items())
    print(f"daemon RSS, N={N}: {shown}; load {os.getloadavg()}")
    # The corpus did reach the daemon: every class was answered.
    for what in ("bogus_tools:REJECTED", "distinct_ids:SUCCESS", "big_outputs:PARTIAL",
                 "huge_arguments:PARTIAL", "cancelled:UNKNOWN_OUTCOME", "watches:dropped",
                 "denied:REJECTED", "runs:ok", "malformed:REJECTED",
                 "bogus_tokens:UNAUTHENTICATED"):  # fmt: skip
        assert tally[what] > 0, (what, dict(tally))
    assert daemon.proc.poll() is None, daemon.log()[-3000:]
    assert figures["2N"] - figures["N"] <= STEADY_MARGIN, shown
    assert figures["2N"] - figures["initial"] <= TOTAL_ALLOWANCE, shown


def _md(who: Who) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {who.token}"),)


@pytest.mark.parametrize("field", ["reason", "requester"])
def test_a_cancel_with_an_over_long_text_is_refused_naming_the_field(
    daemon: Daemon, field: str
) -> None:
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.ExecutorStub(channel)
        fits = pb.CancelRequest(run_id="r-cap", **{field: "x" * MAX_REASON_CHARS})
        assert stub.Cancel(fits, timeout=10, metadata=_md(AGENTS[0])).call_ids == []
        long = pb.CancelRequest(run_id="r-cap", **{field: "x" * (MAX_REASON_CHARS + 1)})
        with pytest.raises(grpc.RpcError) as refused:
            stub.Cancel(long, timeout=10, metadata=_md(AGENTS[0]))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (
        refused.value.details() == f"too_large: {field}: longer than {MAX_REASON_CHARS} characters"
    )
    trailers = dict(refused.value.trailing_metadata() or ())
    assert (trailers["execgate-error-class"], trailers["execgate-field"]) == ("too_large", field)


def test_a_cancel_run_with_an_over_long_reason_is_refused(daemon: Daemon) -> None:
    md = _md(AGENTS[0])
    with grpc.insecure_channel(daemon.address) as channel:
        runs = rpb_grpc.RunsStub(channel)
        runs.StartRun(rpb.StartRunRequest(run_id="run-cap"), timeout=10, metadata=md)
        long = rpb.CancelRunRequest(run_id="run-cap", reason="x" * (MAX_REASON_CHARS + 1))
        with pytest.raises(grpc.RpcError) as refused:
            runs.CancelRun(long, timeout=10, metadata=md)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "reason" in refused.value.details()
        run = runs.CancelRun(
            rpb.CancelRunRequest(run_id="run-cap", reason="ok"), timeout=10, metadata=md
        )
    assert run.cancel.reason == "ok"


def test_a_run_watcher_far_behind_is_told_where_to_resume(daemon: Daemon) -> None:
    """More events at once than a watcher's backlog holds: the stream ends with
    RESOURCE_EXHAUSTED naming the seq to resume after, instead of queueing them all."""
    from execgate.executor.core.fanout import MAX_BACKLOG

    states = ["created"] + ["requesting_model", "validating"] * MAX_BACKLOG
    events = [
        rpb.RunEvent(seq=i, from_state=states[i - 1], to_state=states[i])
        for i in range(1, MAX_BACKLOG + 3)
    ]
    md = _md(AGENTS[0])
    with grpc.insecure_channel(daemon.address) as channel:
        runs = rpb_grpc.RunsStub(channel)
        runs.StartRun(rpb.StartRunRequest(run_id="run-lag"), timeout=10, metadata=md)
        watch = runs.WatchRun(rpb.WatchRunRequest(run_id="run-lag"), timeout=30, metadata=md)
        first = runs.AppendEvents(
            rpb.AppendEventsRequest(run_id="run-lag", events=events[:1]), timeout=10, metadata=md
        )
        assert next(watch).event.seq == 1  # subscribed and reading
        more = rpb.AppendEventsRequest(run_id="run-lag", events=events[1:])
        runs.AppendEvents(more, timeout=10, metadata=md)
        with pytest.raises(grpc.RpcError) as ended:
            for _ in watch:
                pass
    assert first.last_seq == 1
    assert ended.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "resume with after_seq=1" in ended.value.details()
