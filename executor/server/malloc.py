"""glibc's allocator, pinned so that big transient buffers go back to the OS.

A request with 4 MiB of arguments, a command printing a megabyte, a gRPC message:
each is a large buffer that lives for one call. glibc serves allocations above its
mmap threshold with mmap and returns them on free, but by default the threshold is
*dynamic*: every freed mmapped chunk raises it (up to 32 MiB on 64-bit), after which
the same buffers come from the heap arenas, where freed space is kept and
fragments. Under the hostile corpus that alone took the daemon from ~70 MiB to
~130 MiB and climbing (bench/memory.py). Setting the threshold explicitly turns the
dynamic adjustment off: every buffer of MMAP_THRESHOLD_BYTES or more is mmapped
and unmapped when freed.

Skipped where the C library is not glibc, and when the operator set any
MALLOC_MMAP_THRESHOLD_ / MALLOC_ARENA_MAX variable (their tuning wins).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("execgate.malloc")

# Buffers of this size or more are mmapped (and unmapped on free): glibc's default
# starting threshold, kept fixed.
MMAP_THRESHOLD_BYTES = 128 * 1024
# mallopt's parameter number for the threshold (malloc.h: M_MMAP_THRESHOLD).
_M_MMAP_THRESHOLD = -3
_OPERATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_")


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold`; True if it was set here."""
    if any(v in os.environ for v in _OPERATOR_VARIABLES):
        log.info("malloc tuning left to the MALLOC_* environment variables")
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
