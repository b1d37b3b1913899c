"""The lock table of `--locks postgresql`: its rows and its critical section. The
grant rule is not here: it is the locks room's (`locks.decide`), handed in as `rule`.

One row per plan, waiting or granted, in a lock space (the daemons serving one
workspace). Every change is one transaction that first takes a transaction-level
advisory lock on the space (NS_LOCKS, hash of the space): daemons change a space's
table one at a time, and the lock is released by the commit (or by the server
when the session dies), never held across an await of anything but the server.

A change runs the grant pass in the same transaction (`rule` over the rows in
fair order returns the tickets to grant) and, if anything was granted or removed,
NOTIFYs `execgate_locks` with the space and the tickets granted, delivered at commit:
a waiting daemon learns its grants from the payload, with no query (`PgLockManager`).
Since every change grants whatever it made grantable, a notification that grants
nothing of a daemon's leaves its waiters waiting. A reap deletes entries without a
pass: it notifies `*`, and every daemon with waiters runs a pass of its own. Lock rows need
no durability (locks mean nothing after every daemon is gone): commits are not
waited for on disk.

Entries of a daemon that died are deleted when it is reaped (presence.py), with
the same notification.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .db import Conn, PgDb
from .presence import LOCKS_CHANNEL
from .schema import NS_LOCKS


class Row(NamedTuple):
    ticket: int
    daemon: int
    owner: str
    plan: str
    granted: bool
    flow: str
    cap: int


# The grant rule: the rows of a space in fair order -> the waiting tickets to grant.
Rule = Callable[[list[Row]], set[int]]


class Pass(NamedTuple):
    """A space's table after a change and its grant pass, in fair order."""

    rows: list[Row]
    # Tickets granted by this pass.
    granted: frozenset[int]


class PgLockTable:
    """The rows of one lock space in the journal's database."""

    def __init__(self, db: PgDb, daemon_id: int, space: str) -> None:
        self.db = db
        self.space = space
        self._me = daemon_id

    # Every method is a coroutine for the db's loop (`PgDb.submit`, `PgDb.on_loop`).

    async def enqueue(
        self, owner: str, plan: str, flow: str, cap: int, rule: Rule
    ) -> tuple[int, Pass]:
        """Add a waiting entry (tagged in fair order) and run the grant pass."""

        async def step(conn: Conn) -> tuple[int, Pass]:
            await self._enter(conn)
            tag = await self._next_tag(conn, flow)
            cur = await conn.execute(
                "INSERT INTO lock_entries (space, daemon, owner, plan, flow, cap, tag) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING ticket",
                (self.space, self._me, owner, plan, flow, cap, tag),
            )
            row = await cur.fetchone()
            assert row is not None
            return int(row[0]), await self._pass(conn, rule, changed=False)

        return await self.db.transaction(step, durable=False, pipelined=True)

    async def remove(self, ticket: int, rule: Rule) -> Pass:
        """Delete an entry (a release, or a waiter giving up) and run the grant pass."""

        async def step(conn: Conn) -> Pass:
            await self._enter(conn)
            cur = await conn.execute(
                "DELETE FROM lock_entries WHERE ticket = %s AND daemon = %s RETURNING ticket",
                (ticket, self._me),
            )
            return await self._pass(conn, rule, changed=await cur.fetchone() is not None)

        return await self.db.transaction(step, durable=False, pipelined=True)

    async def grant_pass(self, rule: Rule) -> Pass:
        """Run the grant pass alone (a waiter woken by a notification, or re-reading)."""

        async def step(conn: Conn) -> Pass:
            await self._enter(conn)
            return await self._pass(conn, rule, changed=False)

        return await self.db.transaction(step, durable=False, pipelined=True)

    async def rows(self) -> list[Row]:
        return await self.db.read(self._rows)

    async def leave(self) -> None:
        """Delete every entry of this daemon in the space (it stops)."""

        async def step(conn: Conn) -> None:
            await self._enter(conn)
            await conn.execute(
                "DELETE FROM lock_entries WHERE space = %s AND daemon = %s", (self.space, self._me)
            )
            await self._notify(conn)

        await self.db.transaction(step, durable=False)

    # -- inside a step --------------------------------------------------------------------

    async def _enter(self, conn: Conn) -> None:
        """The space's critical section, until the transaction ends."""
        await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (NS_LOCKS, self.space))

    async def _next_tag(self, conn: Conn, flow: str) -> int:
        """decide.Turns over the table: one more than the flow's (this daemon's agent's)
        last waiting tag, and than the smallest waiting tag."""
        cur = await conn.execute(
            "SELECT MIN(tag), MAX(CASE WHEN daemon = %s AND flow = %s THEN tag END) "
            "FROM lock_entries WHERE space = %s AND NOT granted",
            (self._me, flow, self.space),
        )
        row = await cur.fetchone()
        smallest, last = row if row is not None else (None, None)
        return max(last or 0, smallest or 0) + 1

    async def _pass(self, conn: Conn, rule: Rule, *, changed: bool) -> Pass:
        rows = await self._rows(conn)
        granted = rule(rows)
        if granted:
            await conn.execute(
                "UPDATE lock_entries SET granted = true WHERE ticket = ANY(%s)", (list(granted),)
            )
            rows = [r._replace(granted=True) if r.ticket in granted else r for r in rows]
        if granted:
            await self._notify(conn, granted)
        elif changed:
            await self._notify(conn)
        return Pass(rows, frozenset(granted))

    async def _rows(self, conn: Conn) -> list[Row]:
        cur = await conn.execute(
            "SELECT ticket, daemon, owner, plan, granted, flow, cap FROM lock_entries "
            "WHERE space = %s ORDER BY tag, ticket",
            (self.space,),
        )
        return [Row(*r) for r in await cur.fetchall()]

    async def _notify(self, conn: Conn, granted: set[int] | None = None) -> None:
        await conn.execute("SELECT pg_notify(%s, %s)", (LOCKS_CHANNEL, notice(self.space, granted)))


# A notification's payload: the space, and the tickets the change granted ("" if none, or
# too many to say: then every waiting daemon runs a pass of its own). 8000 bytes at most.
MAX_TOLD = 500


def notice(space: str, granted: set[int] | None) -> str:
    if not granted or len(granted) > MAX_TOLD:
        return space
    return space + "|" + ",".join(map(str, sorted(granted)))


def told(payload: str, space: str) -> frozenset[int] | None:
    """The tickets a notification about `space` says were granted (empty: none, a pass
    found nothing more to grant); None: not about this space."""
    name, _, tickets = payload.partition("|")
    if name != space:
        return None
    return frozenset(int(t) for t in tickets.split(",") if t)
