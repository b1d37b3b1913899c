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

import pytest

from tests.daemon import Daemon
from tests.security.budget import race_rounds
from tests.security.hostile import MIB, POLICY, Hostile, rss
from tests.security.sink import OtlpSink

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
    d = Daemon(root, "--policy", str(root / "policy.yaml"), env=sink.env(interval_ms=500))
    d.start()
    yield d
    d.stop()


def test_rss_reaches_a_steady_state_under_the_hostile_corpus(
    daemon: Daemon, sink: OtlpSink
) -> None:
    assert daemon.proc is not None
    pid = daemon.proc.pid
    figures = {"initial": rss(pid)}
    with Hostile(daemon.address) as hostile:
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
                 "denied:REJECTED", "runs:ok", "malformed:REJECTED"):  # fmt: skip
        assert tally[what] > 0, (what, dict(tally))
    assert daemon.proc.poll() is None, daemon.log()[-3000:]
    assert figures["2N"] - figures["N"] <= STEADY_MARGIN, shown
    assert figures["2N"] - figures["initial"] <= TOTAL_ALLOWANCE, shown
