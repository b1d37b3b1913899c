"""The journal: the durable record of every call (SQLite, WAL, synchronous=FULL).

Write rules, which crash recovery relies on:
- a call's intent (row in state 'running') is committed before the call starts;
  for a call that may write, with fsync (durable); for a read-only call, in the
  same transaction group without forcing an fsync (nothing to reconcile);
- its outcome is committed before it is reported to anyone;
- at startup, `recover` turns every 'running' row into UNKNOWN_OUTCOME (may
  write) or FAILURE/interrupted (read-only). Nothing is dropped or marked done.

`Journal` is the SQLite `base.JournalStore`: one database (db.py), its calls
(calls.py) and a store per other record kind, all writing through one writer.
"""

from __future__ import annotations

import os

from .approvals import SqliteApprovals
from .calls import SqliteCalls
from .cancels import SqliteCancels
from .db import SqliteDb
from .notices import NoNotices
from .records import CallFilter, CallRecord, DuplicateCall, PolicyRecord
from .recover import recover_running
from .reloads import SqliteReloads
from .runs import SqliteRuns
from .spans import SqliteSpans

__all__ = ["CallFilter", "CallRecord", "DuplicateCall", "Journal", "PolicyRecord"]


class Journal(SqliteCalls):
    """The journal at `path` (created, or migrated to the daemon's schema)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        db = SqliteDb(path)
        super().__init__(db)
        self.path = db.path
        self.approvals = SqliteApprovals(db)
        self.runs = SqliteRuns(db)
        self.cancels = SqliteCancels(db)
        self.reloads = SqliteReloads(db)
        self.spans = SqliteSpans(db)
        self.notices = NoNotices()  # one daemon writes it: nothing happens elsewhere

    def recover(self) -> int:
        """Settle calls a previous daemon left running. Returns how many."""
        return self._db.write_sync(recover_running, durable=True)

    def close(self) -> None:
        self._db.close()
