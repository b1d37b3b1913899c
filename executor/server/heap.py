"""The cyclic garbage collector, set for a daemon whose heap is mostly its startup.

By the time the daemon serves, its heap holds ~130,000 tracked objects that live as
long as it does (modules, the SDKs, grpc, the tools, the policy). CPython's
collector walks all of them in every full collection: 100-300 ms with the event
loop stopped, every time the allocations of calls in flight cross its threshold.
Under no-op load one such pause showed as 11 % of the daemon's time in a 10 s
profile (`bench/dispatch.py --profile`), and every call waiting then took it as
latency. So, once startup is done:

- `gc.freeze()` moves every object alive then into the permanent generation, which
  no collection walks again (objects made later are collected as before; a startup
  object that becomes garbage later is still freed by its reference count, and only
  one caught in a cycle -- a tools or policy reload's leftovers -- is kept);
- the first generation's threshold is raised from 700 to GEN0_THRESHOLD
  allocations: a call allocates a few hundred tracked objects, nearly all freed by
  reference counting, so collections ran every call or two for almost nothing.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("execgate.heap")

# Net allocations of tracked objects between young-generation collections.
GEN0_THRESHOLD = 10_000


def settle() -> None:
    """Call once, when startup is done and the daemon is about to serve."""
    gc.collect()  # startup's own garbage, so that only what lives on is frozen
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    log.debug(
        "heap: %d objects frozen; gc thresholds %s", gc.get_freeze_count(), gc.get_threshold()
    )
