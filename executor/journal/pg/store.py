"""The PostgreSQL journal: several daemons sharing one record (`base.JournalStore`).

One `PgDb` (the pool, on its own loop), this daemon's `Presence` (lease, liveness
lock, notifications, reaping of dead daemons), its calls, and a store per other
record kind, each in its module of this package. psycopg is the `postgresql` extra:
this package is imported only when a `postgresql://` journal is asked for.
"""

from __future__ import annotations

from .approvals import PgApprovals
from .calls import PgCalls
from .db import PgDb
from .notices import PgNotices
from .others import PgCancels, PgReloads, PgSpans
from .presence import Presence, settle_running
from .runs import PgRuns

__all__ = ["PgJournal"]


class PgJournal(PgCalls):
    """The journal in the database at `url` (created or migrated), this daemon joined.

    Args:
        url: a libpq connection string or URI (`postgresql://...`).
        lease: seconds this daemon's lease lasts unrenewed; a daemon that stopped
            renewing is reaped within about this long (presence.py).
        name: how this daemon is named in `daemons` (default: host:pid).
        pool_size: the most connections the pool opens.
        retry_for: seconds a write waits for an unreachable server before it fails.
    """

    def __init__(
        self,
        url: str,
        *,
        lease: float = 10.0,
        name: str = "",
        pool_size: int = 8,
        retry_for: float = 30.0,
    ) -> None:
        db = PgDb(url, pool_size=pool_size, retry_for=retry_for)
        try:
            presence = Presence(db, lease=lease, name=name)
        except BaseException:
            db.close()
            raise
        super().__init__(db, presence)
        self.db = db
        self.presence = presence
        self.notices = PgNotices(presence)
        self.call_ended = self.notices.call_ended
        self.approvals = PgApprovals(db, presence.daemon_id, self.notices.approval_changed)
        self.runs = PgRuns(db, self.notices.run_changed)
        self.cancels = PgCancels(db)
        self.cancels.notify = self.notices.cancelled
        self.reloads = PgReloads(db)
        self.spans = PgSpans(db)

    def recover(self) -> int:
        """Settle the calls of every daemon found dead now (this one's earlier life
        included), and those any stopped or reaped daemon left; a daemon whose death
        shows only at its lease's end is reaped then, by whichever daemon's heartbeat
        comes first."""
        return self.presence.reap_now() + self.db.write_sync(
            lambda c: settle_running(c, None, self.presence.daemon_id), durable=True
        )

    def close(self) -> None:
        try:
            self.presence.close()
        finally:
            self._db.close()
