"""What a lock backend is: `acquire` a plan, get a `Lease`, release it.

Exceptions:

    ExecgateError
    └── LockError              a lock backend cannot serve the request
        ├── Abandoned          the waiter's cancel event fired before the grant
        └── BackendClosed      the backend was closed (the daemon is stopping)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from execgate.executor.core.errors import ExecgateError

from .keys import Key
from .modes import LockMode


class LockError(ExecgateError):
    """Root of the lock package's exceptions."""


class Abandoned(LockError):
    """The waiter gave up (its call was cancelled) before its locks were granted.

    Nothing is held and the waiter is no longer queued.
    """

    def __init__(self, owner: str) -> None:
        super().__init__(f"{owner} gave up waiting for its locks")
        self.owner = owner


class BackendClosed(LockError):
    """The backend was closed; nothing can be acquired any more."""


@dataclass(frozen=True, slots=True)
class WaitInfo:
    """Why a call waits: the keys it conflicts on and whom it waits for.

    `blockers` are owners, holders first (in grant order), then waiters ahead of
    it (in fair order); each appears once. `capped`: the call's flow (its agent)
    already holds this many grants, its cap, so it also waits for one of them to end
    (0: it does not).
    """

    keys: tuple[Key, ...]
    blockers: tuple[str, ...]
    capped: int = 0


@dataclass(frozen=True, slots=True)
class LockEntry:
    """One owner's plan in a lock table, as `snapshot` shows it."""

    owner: str
    plan: tuple[tuple[Key, LockMode], ...]
    granted: bool
    # The daemon instance that asked (file backend); "" in process.
    instance: str = ""
    # Whose turn it is (the agent; decide.Turns), and how many grants it may hold.
    flow: str = ""
    cap: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    holders: tuple[LockEntry, ...]
    # In fair order (decide.Turns): arrival order within each flow.
    waiters: tuple[LockEntry, ...]


class Lease:
    """The locks of one granted plan. `release()` gives them back exactly once.

    Also an async context manager, so `async with await backend.acquire(...):`
    holds the locks for the block. There is no await between the grant and the
    start of the block, so a cancellation cannot leak the lease there.
    """

    __slots__ = ("_release", "owner", "plan")

    def __init__(
        self, owner: str, plan: Mapping[Key, LockMode], release: Callable[[Lease], None]
    ) -> None:
        self.owner = owner
        # As the caller gave it; the backend decides on its own copy.
        self.plan = plan
        # None once released: release() is idempotent.
        self._release: Callable[[Lease], None] | None = release

    @property
    def released(self) -> bool:
        return self._release is None

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release(self)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<Lease {self.owner} {state} {len(self.plan)} keys>"


class LockBackend(Protocol):
    """A lock manager: in process (`LockManager`) or shared by daemons (`FileLockManager`)."""

    async def acquire(
        self,
        owner: str,
        plan: Mapping[Key, LockMode],
        *,
        cancel: asyncio.Event | None = None,
        on_wait: Callable[[WaitInfo], None] | None = None,
        flow: str = "",
        cap: int = 0,
    ) -> Lease: ...

    def snapshot(self) -> Snapshot: ...

    def close(self) -> None: ...
