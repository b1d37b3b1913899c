"""The cgroup leaves of warm calls: made before their call, removed after it.

A cold call makes its leaves on its way in and removes them on its way out; a
memory cgroup's mkdir may take milliseconds on a busy host, so a warm call takes a
leaf made in advance (with the daemon's default limits; a call with others gets
them written at its start) and leaves its removal for later. Both happen in a
thread of their own, never behind tool work in the default executor. A leaf is
used by one call only: its counters (OOM kills, memory charged) are that call's.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import secrets
from concurrent.futures import ThreadPoolExecutor

from .base import Confinement
from .cgroup import CallCgroup, CgroupRoot

log = logging.getLogger("execgate.sandbox")

# Leaves kept made ahead.
READY = 2
_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="execgate-leaves")


class Leaves:
    """Invariant: `_pending` is the one refill in the thread, if any; its leaf joins
    `_ready` when it is made."""

    def __init__(self, cgroups: CgroupRoot | None, made_with: Confinement) -> None:
        self.cgroups = cgroups
        self.made_with = made_with
        self._ready: collections.deque[CallCgroup] = collections.deque()
        # Appended to from the event loop, emptied in the thread (a deque is safe for that).
        self._finished: collections.deque[CallCgroup] = collections.deque()
        self._pending: asyncio.Future[CallCgroup | None] | None = None
        # Where hosts wait between calls (made at the first call).
        self._park: CallCgroup | None = None

    async def take(self, conf: Confinement) -> CallCgroup | None:
        """A fresh leaf with `conf`'s limits (None where the daemon makes no cgroups)."""
        if self.cgroups is None:
            return None
        if self._ready:
            group: CallCgroup | None = self._ready.popleft()
        else:
            group = await asyncio.get_running_loop().run_in_executor(_THREAD, self._make)
        self._refill()
        if group is not None and _limits(conf) != _limits(self.made_with):
            self.cgroups.relimit(group, conf)
        return group

    def park(self) -> list[int]:
        """Descriptors of the leaves hosts are parked in between calls (none where the
        daemon makes no cgroups); the caller closes them."""
        if self.cgroups is None:
            return []
        if self._park is None:
            self._park = self.cgroups.leaf("warm-park", Confinement(), need_kill=False, limit=False)
        dirs = self._park.dirs if self._park is not None else ()
        return [os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for d in dirs]

    def flags(self, group: CallCgroup | None) -> tuple[bool, bool]:
        """Does a call's leaf limit its processes, its memory? (Else rlimits do.)"""
        if group is None:
            return False, False
        return group.limits_pids, group.limits_memory

    def done(self, group: CallCgroup | None) -> None:
        """The call is over (nothing of it is alive): its leaf goes at the next sweep."""
        if group is not None:
            self._finished.append(group)
            self._refill()

    def _refill(self) -> None:
        """Sweep, and make a leaf if fewer than READY are made, in the thread."""
        if self._pending is not None:
            return
        if len(self._ready) >= READY and not self._finished:
            return
        self._pending = asyncio.get_running_loop().run_in_executor(_THREAD, self._work)
        self._pending.add_done_callback(self._made)

    def _made(self, future: asyncio.Future[CallCgroup | None]) -> None:
        self._pending = None
        if future.cancelled():
            return
        if (exc := future.exception()) is not None:
            log.warning("cannot make a call's cgroup leaf: %s", exc)
            return
        group = future.result()
        if group is not None:
            self._ready.append(group)
            if len(self._ready) < READY:
                self._refill()

    def _work(self) -> CallCgroup | None:
        self.sweep()
        return self._make() if len(self._ready) < READY else None

    def _make(self) -> CallCgroup | None:
        assert self.cgroups is not None
        return self.cgroups.leaf(secrets.token_hex(8), self.made_with, need_kill=False)

    def sweep(self) -> None:
        """Remove finished leaves (one whose last member is still being reaped: next time)."""
        for _ in range(len(self._finished)):
            group = self._finished.popleft()
            if not group.try_remove():
                self._finished.append(group)

    async def close(self) -> None:
        """Shutdown: every call is over; their leaves and the unused ones go."""
        if self._pending is not None:
            await asyncio.wait({self._pending})
        self._finished.extend(self._ready)
        self._ready.clear()
        if self._park is not None:  # every host is gone by now
            self._finished.append(self._park)
            self._park = None
        await asyncio.get_running_loop().run_in_executor(_THREAD, self.sweep)


def _limits(conf: Confinement) -> tuple[int, int]:
    """What a leaf holds of a confinement."""
    return conf.processes, conf.memory_bytes
