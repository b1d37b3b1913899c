"""The daemon's clock for the moments a timeline records.

A timeline's marks are compared with each other (the grace period between
`signal_sent` and `grace_expired`, how long a call waited). The wall clock can
step under a running daemon (a time sync on a freshly booted machine, a
suspended VM's clock catching up), which would bend those intervals: a 1 s
grace would read as 11 s. So marks are the wall-clock time of the daemon's
start plus the monotonic time elapsed since: intervals between marks are
exact, and a mark stays within any later wall-clock step of true time.

Deadlines a client sent (absolute wall-clock times) are still compared with
`time.time()`: they are the client's clock, not ours.
"""

from __future__ import annotations

import time

_WALL_AT_START = time.time()
_MONO_AT_START = time.monotonic()


def now() -> float:
    """Seconds since the epoch, as the wall clock read at start plus elapsed monotonic time."""
    return _WALL_AT_START + (time.monotonic() - _MONO_AT_START)
