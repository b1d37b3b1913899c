"""A daemon's presence in the shared database: its lease, its liveness lock, and the
notifications it listens to; and the reaping of daemons that died.

Each daemon joins with a row in `daemons` and, on a connection of its own (the
presence session), takes a session-level advisory lock on its id (NS_PRESENCE, id)
in the same transaction, and LISTENs there. A heartbeat renews its lease
(`lease_until`, server clock) every third of the lease.

A daemon is dead, and any other daemon reaps it, when
- its lease ran out (it could not renew: hung, partitioned, or gone), or
- its presence session is gone: its advisory lock is free although it was taken
  since the server last started (a lock taken before a server restart is free
  because of the restart, and only the lease decides).
Reaping is one transaction (`reap`): the daemon's row becomes 'reaped', every call it
left running becomes UNKNOWN_OUTCOME/interrupted (FAILURE if read-only), its lock
entries are deleted (waiters are told on `execgate_locks`), and its pending approvals
pass to the reaper, which parks them (`on_adopted`).

Fencing: a call's intent is written only `WHERE` the writer's row is alive with an
unexpired lease (`ALIVE_SQL`), in the same statement; a daemon that lost its lease
can no longer start a call under the locks it was granted. A daemon that finds it
lost its lease (the renewal or the rejoin of its session finds its row reaped or
expired) tells `on_lost`, and the daemon stops (server/serve.py): whatever it ran
was already settled by its reaper.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import psycopg

from execgate.executor.core import clock
from execgate.executor.core.approval import Approval
from execgate.executor.core.errors import ExecgateError

from ..codec import outcome_to_json
from ..records import NoticeKind
from ..recover import interrupted_outcome
from .approvals import COLUMNS, approval_of
from .db import Conn, PgDb
from .schema import NS_PRESENCE

log = logging.getLogger("execgate.journal")

# Notification channels: lock tables changed (payload: the lock space), and records
# other daemons must act on (payload: notices.py).
LOCKS_CHANNEL = "execgate_locks"
RECORDS_CHANNEL = "execgate_records"
CHANNELS = (LOCKS_CHANNEL, RECORDS_CHANNEL)

# A subscriber gets a notification's payload, or None after the presence session was
# re-established: notifications may have been missed, re-read what you watch.
Subscriber = Callable[[str | None], None]


class LeaseLost(ExecgateError):
    """This daemon's lease in the shared database is lost (`daemon_id`): another daemon
    may have settled its calls and freed its locks, so it may not act as their holder."""

    def __init__(self, daemon_id: int) -> None:
        super().__init__(
            f"daemon {daemon_id} lost its lease in the shared database: it may no longer "
            "start calls under its locks"
        )
        self.daemon_id = daemon_id


class Presence:
    """This daemon in `daemons`: joined at construction, left at `close`."""

    # The writer's row is alive and its lease unexpired (one parameter: its id).
    ALIVE_SQL = (
        "EXISTS (SELECT 1 FROM daemons WHERE id = %s AND state = 'alive' "
        "AND lease_until > clock_timestamp())"
    )

    def __init__(self, db: PgDb, *, lease: float = 10.0, name: str = "") -> None:
        self._db = db
        self.lease = lease
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.lost = False
        # Set once joined; never changes (a daemon that lost its lease stops).
        self.daemon_id = 0
        self._subs: dict[str, list[Subscriber]] = {ch: [] for ch in CHANNELS}
        self.on_lost: list[Callable[[], None]] = []
        # Called (on the db's loop) with the approvals a reap passed to this daemon.
        self.on_adopted: list[Callable[[list[Approval]], None]] = []
        self._conn: psycopg.AsyncConnection[Any] | None = None
        db.call(self._join())
        self._closing = False
        self._task = db.submit(self._run())

    # -- public -------------------------------------------------------------------------

    def subscribe(self, channel: str, fn: Subscriber) -> Callable[[], None]:
        """Call `fn` (on the db's loop) with each notification on `channel`; returns the
        unsubscriber."""
        self._subs[channel].append(fn)
        return lambda: self._subs[channel].remove(fn) if fn in self._subs[channel] else None

    def reap_now(self) -> int:
        """Reap every dead daemon now (blocking; at startup); how many calls were settled."""
        return self._db.write_sync(self._reap, durable=True)

    def close(self) -> None:
        """Leave: the row 'stopped', this daemon's lock entries gone, the session closed."""
        self._closing = True
        self._task.cancel()
        try:
            self._db.write_sync(self._leave, durable=True)
        except ExecgateError as exc:
            log.warning("journal: could not record this daemon's stop: %s", exc)
        self._db.call(self._disconnect())

    # -- the presence session ----------------------------------------------------------------

    async def _join(self) -> None:
        conn = await self._connect()
        async with conn.transaction():
            cur = await conn.execute(
                "INSERT INTO daemons (name, started_at, session_at, lease_until, state) "
                "VALUES (%s, %s, now(), now() + make_interval(secs => %s), 'alive') RETURNING id",
                (self.name, clock.now(), self.lease),
            )
            row = await cur.fetchone()
            assert row is not None
            self.daemon_id = int(row[0])
            await conn.execute("SELECT pg_advisory_lock(%s, %s)", (NS_PRESENCE, self.daemon_id))
        await self._listen(conn)
        self._conn = conn

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(self._db.url, autocommit=True)

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        for channel in CHANNELS:
            await conn.execute(f"LISTEN {channel}")

    async def _rejoin(self) -> None:
        """A new presence session for the same row, if the lease still holds."""
        await self._disconnect()
        conn = await self._connect()
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_lock(%s, %s)", (NS_PRESENCE, self.daemon_id))
                cur = await conn.execute(
                    "UPDATE daemons SET session_at = now(), "
                    "lease_until = now() + make_interval(secs => %s) "
                    "WHERE id = %s AND state = 'alive' AND lease_until > clock_timestamp()",
                    (self.lease, self.daemon_id),
                )
                kept = cur.rowcount == 1
            await self._listen(conn)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        if not kept:
            self._lose()
            return
        log.info("journal: presence session re-established (daemon %d)", self.daemon_id)
        self._tell_all(None)  # notifications may have been missed meanwhile

    async def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _run(self) -> None:
        """Listen, renew the lease every third of it, reap the dead; survive server restarts."""
        interval = self.lease / 3
        while not self.lost:
            try:
                if self._conn is None:
                    await self._rejoin()
                    continue
                await self._beat()
                async for note in self._conn.notifies(timeout=interval):
                    self._tell(note.channel, note.payload)
            except (psycopg.OperationalError, ExecgateError) as exc:
                if self._closing:
                    return
                log.warning("journal: presence session lost, reconnecting: %s", exc)
                await self._disconnect()
                await asyncio.sleep(min(1.0, interval))

    async def _beat(self) -> None:
        renewed = await self._db.transaction(self._renew, durable=False)
        if not renewed:
            self._lose()
            return
        await self._db.transaction(self._reap, durable=True)

    async def _renew(self, conn: Conn) -> bool:
        cur = await conn.execute(
            "UPDATE daemons SET lease_until = now() + make_interval(secs => %s) "
            "WHERE id = %s AND state = 'alive' AND lease_until > clock_timestamp()",
            (self.lease, self.daemon_id),
        )
        return cur.rowcount == 1

    def _lose(self) -> None:
        if self.lost:
            return
        self.lost = True
        log.error("journal: daemon %d lost its lease in the shared database", self.daemon_id)
        for fn in list(self.on_lost):
            fn()

    def _tell(self, channel: str, payload: str | None) -> None:
        for fn in list(self._subs.get(channel, ())):
            try:
                fn(payload)
            except Exception:
                log.exception("journal: a %s subscriber failed", channel)

    def _tell_all(self, payload: str | None) -> None:
        for channel in CHANNELS:
            self._tell(channel, payload)

    # -- reaping ------------------------------------------------------------------------------

    async def _reap(self, conn: Conn) -> int:
        """Settle every dead daemon (one transaction); how many running calls it settled."""
        cur = await conn.execute(
            "SELECT id FROM daemons WHERE state = 'alive' AND id != %s AND ("
            "lease_until < clock_timestamp() OR (session_at > pg_postmaster_start_time() "
            "AND pg_try_advisory_xact_lock(%s, id::int))) FOR UPDATE SKIP LOCKED",
            (self.daemon_id, NS_PRESENCE),
        )
        dead = [int(r[0]) for r in await cur.fetchall()]
        if not dead:
            return 0
        await conn.execute(
            "UPDATE daemons SET state = 'reaped', ended_at = %s, ended_by = %s WHERE id = ANY(%s)",
            (clock.now(), self.daemon_id, dead),
        )
        settled = await settle_running(conn, dead, self.daemon_id)
        await conn.execute("DELETE FROM lock_entries WHERE daemon = ANY(%s)", (dead,))
        await conn.execute("SELECT pg_notify(%s, '*')", (LOCKS_CHANNEL,))
        adopted = await _adopt_approvals(conn, dead, self.daemon_id)
        log.warning(
            "journal: reaped daemon(s) %s: %d call(s) settled as interrupted, %d approval(s) "
            "adopted",
            dead,
            settled,
            len(adopted),
        )
        if adopted:
            for fn in list(self.on_adopted):
                fn(adopted)
        return settled

    async def _leave(self, conn: Conn) -> None:
        await conn.execute(
            "UPDATE daemons SET state = 'stopped', ended_at = %s WHERE id = %s AND state = 'alive'",
            (clock.now(), self.daemon_id),
        )
        await conn.execute("DELETE FROM lock_entries WHERE daemon = %s", (self.daemon_id,))
        await conn.execute("SELECT pg_notify(%s, '*')", (LOCKS_CHANNEL,))


async def settle_running(conn: Conn, daemons: list[int] | None, by: int) -> int:
    """Every call left running by `daemons` (None: by any daemon no longer alive) becomes
    interrupted, with a `recovered` mark; retries waiting for a keyed one are told."""
    cols = "seq, may_write, created_at, agent, idempotency_key"
    if daemons is None:
        cur = await conn.execute(
            f"SELECT {cols} FROM calls c WHERE state = 'running' AND NOT "
            "EXISTS (SELECT 1 FROM daemons d WHERE d.id = c.daemon AND d.state = 'alive') "
            "FOR UPDATE"
        )
    else:
        cur = await conn.execute(
            f"SELECT {cols} FROM calls WHERE state = 'running' AND daemon = ANY(%s) FOR UPDATE",
            (daemons,),
        )
    rows = await cur.fetchall()
    now = clock.now()
    for seq, may_write, created_at, agent, key in rows:
        outcome = interrupted_outcome(bool(may_write), created_at)
        await conn.execute(
            "UPDATE calls SET state='finished', finished_at=%s, status=%s, outcome_json=%s "
            "WHERE seq=%s",
            (now, outcome.status.value, outcome_to_json(outcome), seq),
        )
        if key is not None:
            await send_notice(conn, by, NoticeKind.CALL, f"{agent}\0{key}")
    return len(rows)


async def send_notice(
    conn: Conn, sender: int, kind: NoticeKind, key: str, cancel: dict[str, object] | None = None
) -> None:
    """NOTIFY the other daemons (delivered if and when the transaction commits)."""
    payload = json.dumps({"from": sender, "kind": kind.value, "key": key, "cancel": cancel})
    await conn.execute("SELECT pg_notify(%s, %s)", (RECORDS_CHANNEL, payload))


async def _adopt_approvals(conn: Conn, dead: list[int], me: int) -> list[Approval]:
    cur = await conn.execute(
        f"UPDATE approvals SET daemon = %s WHERE state = 'pending' AND daemon = ANY(%s) "
        f"RETURNING {COLUMNS}",
        (me, dead),
    )
    found = [approval_of(r) for r in await cur.fetchall()]
    return sorted(found, key=lambda a: a.created_at)
