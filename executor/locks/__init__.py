"""Multi-granularity locks: which calls may run at the same time.

    keys      Key trees: workspace / directories / files / tables, and net / hosts
    modes     IS IX S SIX X, compatibility, combine; claims (READ/WRITE) -> plan
    decide    the one grant rule every backend applies (all at once, fair order per
              conflict: each agent's calls in arrival order, agents taking turns; caps)
    base      Lease, WaitInfo, Snapshot, the LockBackend protocol, the exceptions
    manager   LockManager: in process, the default
    filelock_backend  FileLockManager: several daemons on one host
    null      NoLocks: grants everything (test-only `--locks none`)

Typical use::

    lease = await backend.acquire(call_id, plan([Claim(path_key("a.txt"), Mode.WRITE)]))
    async with lease:
        ...
"""

from .base import (
    Abandoned,
    BackendClosed,
    Lease,
    LockBackend,
    LockEntry,
    LockError,
    Snapshot,
    WaitInfo,
)
from .filelock_backend import FileLockManager
from .keys import Key, net_key, path_key, table_key, workspace_key
from .manager import LockManager, explain
from .modes import Claim, LockMode, Mode, combine, compatible, plan, plans_conflict
from .null import NoLocks

__all__ = [
    "Abandoned",
    "BackendClosed",
    "Claim",
    "FileLockManager",
    "Key",
    "Lease",
    "LockBackend",
    "LockEntry",
    "LockError",
    "LockManager",
    "LockMode",
    "Mode",
    "NoLocks",
    "Snapshot",
    "WaitInfo",
    "combine",
    "compatible",
    "explain",
    "net_key",
    "path_key",
    "plan",
    "plans_conflict",
    "table_key",
    "workspace_key",
]
