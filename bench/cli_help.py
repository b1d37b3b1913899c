"""How long `execgate --help` takes to answer, against a bare interpreter start.

Runs `python -m execgate.executor.cli --help` (and `--version`, and `calls list --help`)
N times each, interleaved with `python -c pass` as the baseline, and prints the median
wall time of each and its ratio to the baseline measured in the same rounds. The goal
(`--help` under 0.3 s) is printed, never enforced: the exit status is non-zero only if a
command fails.

    .venv/bin/python bench/cli_help.py          # 10 rounds
    .venv/bin/python bench/cli_help.py --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "baseline (python -c pass)": ["-c", "pass"],
    "execgate --help": ["-m", "execgate.executor.cli", "--help"],
    "execgate --version": ["-m", "execgate.executor.cli", "--version"],
    "execgate calls list --help": ["-m", "execgate.executor.cli", "calls", "list", "--help"],
}
GOAL = 0.3


def once(argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], check=False, capture_output=True)
    return time.perf_counter() - start, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="rounds (default: 10)")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CASES}
    failed: dict[str, int] = {}
    for _ in range(args.runs):
        for name, argv in CASES.items():
            seconds, status = once(argv)
            times[name].append(seconds)
            if status:
                failed[name] = status
    base = statistics.median(times["baseline (python -c pass)"])
    for name, seen in times.items():
        median = statistics.median(seen)
        broke = f"  (exit {failed[name]})" if name in failed else ""
        print(f"{name:<30} median {median * 1000:7.1f} ms  {median / base:5.2f}x baseline{broke}")
    help_time = statistics.median(times["execgate --help"])
    verdict = "met" if help_time < GOAL else "missed"
    print(f"goal: --help under {GOAL * 1000:.0f} ms: {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
