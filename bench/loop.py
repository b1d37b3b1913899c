"""What the client loop's record costs: a `Loop` run against the same calls sent bare.

One daemon (process sandbox, `--test-tools`, durable journal). For N steps, a
`ScriptedModel` proposes one `noop` call per step, then answers:

  bare    the same N calls, one `Client.execute` each (ExecuteBatch: what a loop that
          records nothing would send), with idempotency keys as the loop's;
  loop    `Loop.run`: per step one `Runs.StepBatch` (the step's two transitions
          committed, the call, the batch's end committed and fsync'd while the loop
          asks its model), then the final answer's two transitions and the
          pending-call check.

Printed: per-step milliseconds of each, loop / bare, and the CPU each side spent per
step (daemon and client; less sensitive to the machine's load than wall time). Rounds
interleave the two, alternating which goes first, to share the machine's noise; the
median round is reported with the load average before and after, and the goal (loop
step <= 1.5x the bare call) as MET / NOT MET. Results also go to
bench/results/loop.json. The exit status reflects breakage only (a call that did not
succeed, a run that did not complete), never a time.

    python bench/loop.py            # 7 rounds of 100 steps
    python bench/loop.py --quick    # 2 rounds of 20 steps
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


GOAL = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0)
    args = parser.parse_args()
    rounds, steps = (2, 20) if args.quick else (7, 100)
    rounds, steps = args.rounds or rounds, args.steps or steps
    with tempfile.TemporaryDirectory() as tmp:
        env = environment(Path(tmp))
        print(env)
        daemon = Daemon(Path(tmp), "--sandbox", "process").start()
        try:
            assert daemon.proc is not None
            rows = run(daemon.address, daemon.proc.pid, rounds, steps)
        finally:
            daemon.stop()
    report(rows, steps, env)
    return 0


@dataclass(frozen=True)
class Round:
    bare_s: float
    loop_s: float
    # CPU seconds over the round's steps: (daemon, client), each side.
    bare_cpu: tuple[float, float]
    loop_cpu: tuple[float, float]

    @property
    def ratio(self) -> float:
        return self.loop_s / self.bare_s


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(fn: Callable[[], float], pid: int) -> tuple[float, tuple[float, float]]:
    daemon, client = cpu_of(pid), time.process_time()
    wall = fn()
    return wall, (cpu_of(pid) - daemon, time.process_time() - client)


def run(address: str, pid: int, rounds: int, steps: int) -> list[Round]:
    rows = []
    with Client(address) as client:
        looped(client, 5)  # warm up the channel, the daemon and the model path
        for r in range(rounds):
            sides = {
                "bare": lambda r=r: measured(lambda: bare(client, steps, f"bench-bare-{r}"), pid),
                "loop": lambda: measured(lambda: looped(client, steps), pid),
            }
            order = ("bare", "loop") if r % 2 == 0 else ("loop", "bare")
            got = {side: sides[side]() for side in order}
            row = Round(got["bare"][0], got["loop"][0], got["bare"][1], got["loop"][1])
            rows.append(row)
            print(
                f"  round {r + 1}/{rounds}  bare {ms(row.bare_s, steps)} ms/step  "
                f"loop {ms(row.loop_s, steps)} ms/step  loop/bare {row.ratio:5.2f}  "
                f"cpu daemon+client bare {cpu(row.bare_cpu, steps)}  "
                f"loop {cpu(row.loop_cpu, steps)}"
            )
    return rows


def ms(seconds: float, steps: int) -> str:
    return f"{seconds / steps * 1000:7.3f}"


def cpu(used: tuple[float, float], steps: int) -> str:
    return f"{used[0] / steps * 1000:.2f}+{used[1] / steps * 1000:.2f} ms"


def report(rows: list[Round], steps: int, env: dict[str, Any]) -> None:
    mid = sorted(rows, key=lambda r: r.ratio)[(len(rows) - 1) // 2]  # the median round
    summary = {
        "steps": steps,
        "bare_ms_per_step": round(mid.bare_s / steps * 1000, 3),
        "loop_ms_per_step": round(mid.loop_s / steps * 1000, 3),
        "loop_over_bare": round(mid.ratio, 2),
        "ratios": sorted(round(r.ratio, 2) for r in rows),
        "cpu_ms_per_step": {
            "bare": [round(x / steps * 1000, 3) for x in mid.bare_cpu],
            "loop": [round(x / steps * 1000, 3) for x in mid.loop_cpu],
        },
        "loadavg_at_start": env["loadavg_at_start"],
        "loadavg_at_end": os.getloadavg(),
        "goal": GOAL,
        "met": mid.ratio <= GOAL,
    }
    print(json.dumps(summary, indent=2))
    verdict = "MET" if summary["met"] else "NOT MET"
    print(f"goal: loop step <= {GOAL}x the bare call: {mid.ratio:.2f}x (median round)  {verdict}")
    out = ROOT / "bench" / "results" / "loop.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "environment": env,
                **summary,
                "rounds": [
                    {
                        "bare_s": r.bare_s,
                        "loop_s": r.loop_s,
                        "bare_cpu": r.bare_cpu,
                        "loop_cpu": r.loop_cpu,
                    }
                    for r in rows
                ],
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
