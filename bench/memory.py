"""The daemon's memory under the hostile corpus (tests/security/hostile.py).

Starts a real daemon (tests.daemon.Daemon, the hostile policy, OTLP metrics and
traces exported to a receiver that discards them, so every telemetry path is live),
then samples its RSS: at start, after a warm-up, after N rounds and after 2N rounds
of the corpus, with the load average beside each figure (the machine is shared: a
slow round is not a leak). Steady state is judged by the last two: Python's
allocator keeps freed arenas, so the first rounds raise RSS once; a holder that
grows with the number of distinct names keeps raising it.

    .venv/bin/python bench/memory.py              # warm-up 2, N = 10
    .venv/bin/python bench/memory.py --rounds 30  # N = 30
    .venv/bin/python bench/memory.py --quick      # warm-up 1, N = 2

Prints the figures and the growth from N to 2N beside (and as a ratio of) the growth
from the warm-up to N; results go to bench/results/memory.json (git-ignored). The exit status is
non-zero only if the daemon broke (stopped answering), never for a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/memory.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

from tests.daemon import Daemon  # noqa: E402
from tests.security.hostile import MIB, POLICY, Hostile, rss  # noqa: E402
from tests.security.sink import OtlpSink  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "memory.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="N (default 10)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, warmup = (2, 1) if args.quick else (args.rounds, args.warmup)
    samples: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="eg-memory-") as tmp, OtlpSink() as sink:
        root = Path(tmp)
        (root / "policy.yaml").write_text(POLICY)
        daemon = Daemon(root, "--policy", str(root / "policy.yaml"), env=sink.env()).start()
        assert daemon.proc is not None
        pid = daemon.proc.pid
        try:
            with Hostile(daemon.address) as hostile:
                start = time.monotonic()

                def sample(label: str, rounds: int) -> None:
                    figure = {
                        "label": label,
                        "rounds": rounds,
                        "rss_mib": round(rss(pid) / MIB, 1),
                        "load": [round(x, 2) for x in os.getloadavg()],
                        "seconds": round(time.monotonic() - start, 1),
                    }
                    samples.append(figure)
                    print(
                        f"{label:<10} rounds={rounds:<4} rss={figure['rss_mib']:>7} MiB  "
                        f"load={figure['load']}  t={figure['seconds']}s",
                        flush=True,
                    )

                sample("initial", 0)
                hostile.rounds(warmup)
                sample("warm-up", warmup)
                hostile.rounds(n)
                sample("N", warmup + n)
                hostile.rounds(n)
                sample("2N", warmup + 2 * n)
                tally = dict(sorted(hostile.tally.items()))
        finally:
            daemon.stop()
    first = float(samples[2]["rss_mib"]) - float(samples[1]["rss_mib"])  # type: ignore[arg-type]
    second = float(samples[3]["rss_mib"]) - float(samples[2]["rss_mib"])  # type: ignore[arg-type]
    print(f"growth warm-up->N: {first:+.1f} MiB; N->2N: {second:+.1f} MiB", end="")
    print(f" ({second / first:.2f}x)" if first > 0 else "")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"samples": samples, "tally": tally}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
