"""A debugging hook for the daemon's memory: tracemalloc snapshots on demand.

Off unless the environment asks: with EXECGATE_TRACEMALLOC=DIR the daemon traces
every allocation from its start (10 frames each; it costs time and memory, so never
in production), and each SIGUSR2 writes a snapshot to DIR/snapshot-<n>.tracemalloc
(`tracemalloc.Snapshot.load` reads it back). Comparing two snapshots by size
(`snapshot.compare_to(old, "traceback")`) names what holds memory. The hostile
memory tests and bench/memory.py use it to find holders; see docs/operators.md.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import tracemalloc
from pathlib import Path

log = logging.getLogger("execgate.memdebug")

ENV = "EXECGATE_TRACEMALLOC"
FRAMES = 10


def install(loop: asyncio.AbstractEventLoop) -> Path | None:
    """Start tracing and take SIGUSR2 as "write a snapshot", if ENV names a directory."""
    where = os.environ.get(ENV, "")
    if not where:
        return None
    out = Path(where)
    out.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(FRAMES)
    counter = itertools.count(1)

    def dump() -> None:
        path = out / f"snapshot-{next(counter)}.tracemalloc"
        tracemalloc.take_snapshot().dump(str(path))
        log.warning("tracemalloc snapshot written to %s", path)

    loop.add_signal_handler(signal.SIGUSR2, dump)
    log.warning("%s set: tracing allocations (slow); SIGUSR2 writes a snapshot", ENV)
    return out
