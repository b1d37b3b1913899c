"""heap.settle: startup's objects frozen out of the collector's walks, the young
generation's threshold raised (in a child process: it changes the interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

from execgate.executor.server import heap

CHILD = """
import gc, json
from execgate.executor.server import heap
import execgate.executor.server.serve  # the daemon's startup imports
before = len(gc.get_objects())
heap.settle()
gc.collect()
print(json.dumps({
    "before": before,
    "frozen": gc.get_freeze_count(),
    "walked": len(gc.get_objects()),
    "threshold": gc.get_threshold(),
}))
"""


def test_startup_objects_are_frozen_and_the_young_threshold_raised() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    found = json.loads(out)
    assert found["frozen"] > 50_000  # the daemon's modules and SDKs
    assert found["walked"] < found["before"] // 10  # what a full collection still walks
    assert found["threshold"][0] == heap.GEN0_THRESHOLD
