"""No locking at all: every acquire is granted at once. TEST ONLY.

Selected with `execgate serve --locks none --test-tools`, so that tests and
benchmarks can show the lost updates the scheduler prevents. Never a default,
never allowed without --test-tools (see config.ServeConfig.check).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from .base import Abandoned, Lease, Snapshot, WaitInfo
from .keys import Key
from .modes import LockMode


class NoLocks:
    async def acquire(
        self,
        owner: str,
        plan: Mapping[Key, LockMode],
        *,
        cancel: asyncio.Event | None = None,
        on_wait: Callable[[WaitInfo], None] | None = None,
        flow: str = "",
        cap: int = 0,
    ) -> Lease:
        del flow, cap  # no locks, no turns, no caps: that is the point
        if cancel is not None and cancel.is_set():
            raise Abandoned(owner)
        return Lease(owner, plan, lambda lease: None)

    def snapshot(self) -> Snapshot:
        return Snapshot((), ())

    def close(self) -> None:
        pass
