"""What the process sandbox's privilege drop costs per call.

`true` started, supervised to its end and released through the process backend
(as bench/cancel.py's spawn case), with the `setpriv` step that drops uid,
groups and capabilities (`drop`: as the daemon does it here -- to the run-as user
when this runs as root, else no-new-privs and capabilities only) and without it
(`no-drop`: the chain before issue 13), interleaved in rounds in the same run.
Printed: p50/p99 of each, the ratio drop / no-drop and the added milliseconds,
and the load average before and after (the machine is small and shared). Never
fails on a time.

    python bench/privileges.py            # 5 rounds of 40 calls per case
    python bench/privileges.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.cancel import interleaved, sandbox_spawn, summary  # noqa: E402
from execgate.executor.sandbox.cgroup import CgroupRoot, remove_root  # noqa: E402
from execgate.executor.sandbox.privileges import Privileges, resolve  # noqa: E402
from execgate.executor.sandbox.process import ProcessSandbox  # noqa: E402


class NoDrop(Privileges):
    """The spawn chain without the setpriv step."""

    def prefix(self) -> list[str]:
        return []


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def main_async(args: argparse.Namespace) -> int:
    rounds, per_round = (1, 10) if args.quick else (args.rounds, 40)
    with tempfile.TemporaryDirectory(prefix="eg-bench-privs-") as tmp:
        workspace = Path(tmp) / "ws"
        workspace.mkdir()
        os.chmod(tmp, 0o755)
        privs = resolve("", workspace)
        cgroups = CgroupRoot("bench-privs-" + str(os.getpid()))
        group = cgroups if cgroups.available else None
        cases = {
            "no-drop": sandbox_spawn(ProcessSandbox(group, NoDrop(None)), workspace),
            "drop": sandbox_spawn(ProcessSandbox(group, privs), workspace),
        }
        print(f"load average before: {load()}")
        print(f"drop: {privs.describe()}")
        try:
            samples = await interleaved(cases, rounds, per_round)
        finally:
            remove_root(cgroups)
        print(f"load average after:  {load()}")
    base = statistics.median(samples["no-drop"])
    for name, values in samples.items():
        s = summary(values)
        print(f"{name:<8} n={s['n']:<4} p50 {s['p50']:7.2f} ms  p99 {s['p99']:7.2f} ms")
    drop = statistics.median(samples["drop"])
    print(f"drop / no-drop p50: {drop / base:.2f}x (+{drop - base:.2f} ms per call)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
