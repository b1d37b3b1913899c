"""What the client loop's record costs: a `Loop` run against the same calls sent bare.

One daemon (process sandbox, `--test-tools`, durable journal). For N steps, a
`ScriptedModel` proposes one `noop` call per step, then answers:

  bare    the same N calls, one `Client.execute` each (what a loop that records
          nothing would send), same run id scheme;
  loop    `Loop.run`: per step two or three transitions appended to the daemon
          (each an fsync'd SQLite transaction) plus the Execute, then the final
          answer's two transitions and the pending-call check.

Printed: per-step milliseconds of each, and loop / bare. Rounds interleave the two
to share the machine's noise; the median round is reported. Results also go to
bench/results/loop.json. The exit status reflects breakage only (a call that did
not succeed, a run that did not complete), never a time.

    python bench/loop.py            # 5 rounds of 100 steps
    python bench/loop.py --quick    # 2 rounds of 20 steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/loop.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

from bench.dispatch import environment  # noqa: E402
from execgate.client import Call, Client, Loop, Status  # noqa: E402
from execgate.client.models import ScriptedModel  # noqa: E402
from tests.daemon import Daemon  # noqa: E402


def bare(client: Client, steps: int, tag: str) -> float:
    start = time.perf_counter()
    for i in range(steps):
        call = Call(tool="noop", arguments={}, call_id=f"s{i}c1", idempotency_key=f"{tag}:{i}")
        (outcome,) = client.execute([call], run_id=tag)
        if outcome.status is not Status.SUCCESS:
            raise SystemExit(f"bare call failed: {outcome}")
    return time.perf_counter() - start


def looped(client: Client, steps: int) -> float:
    script = [ScriptedModel.calls(("noop", {})) for _ in range(steps)]
    model = ScriptedModel([*script, ScriptedModel.answer("done")])
    loop = Loop(client, model, limits={"max_steps": steps + 1, "max_repeats": steps + 1})
    start = time.perf_counter()
    result = loop.run("bench")
    elapsed = time.perf_counter() - start
    if not result.completed:
        raise SystemExit(f"loop did not complete: {result}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, steps = (2, 20) if args.quick else (5, 100)
    with tempfile.TemporaryDirectory() as tmp:
        print(environment(Path(tmp)))
        daemon = Daemon(Path(tmp), "--sandbox", "process").start()
        try:
            rows = run(daemon.address, rounds, steps)
        finally:
            daemon.stop()
    report(rows, steps)
    return 0


def run(address: str, rounds: int, steps: int) -> list[tuple[float, float]]:
    rows = []
    with Client(address) as client:
        looped(client, 5)  # warm up the channel, the daemon and the model path
        for r in range(rounds):
            b = bare(client, steps, f"bench-bare-{r}")
            lo = looped(client, steps)
            rows.append((b, lo))
            print(
                f"  round {r + 1}/{rounds}  bare {b / steps * 1000:7.3f} ms/step  "
                f"loop {lo / steps * 1000:7.3f} ms/step  loop/bare {lo / b:5.2f}"
            )
    return rows


def report(rows: list[tuple[float, float]], steps: int) -> None:
    ratios = sorted(lo / b for b, lo in rows)
    mid = rows[[lo / b for b, lo in rows].index(statistics.median_low(ratios))]
    b, lo = mid
    summary = {
        "steps": steps,
        "bare_ms_per_step": round(b / steps * 1000, 3),
        "loop_ms_per_step": round(lo / steps * 1000, 3),
        "loop_over_bare": round(lo / b, 2),
        "ratios": [round(x, 2) for x in ratios],
    }
    print(json.dumps(summary, indent=2))
    out = ROOT / "bench" / "results" / "loop.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
