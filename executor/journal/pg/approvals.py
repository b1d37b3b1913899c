"""The `approvals` table on PostgreSQL (`base.ApprovalStore`), as the SQLite one
(journal/approvals.py), and the daemon each call is parked on.

Several daemons: a decision is one conditional UPDATE (`WHERE state='pending'`), so
of a decision through one daemon and an expiry on another exactly one wins; the
winner tells the other daemons (`notices.py`), and the daemon the call is parked on
wakes it. `left_pending` takes only the approvals no live daemon holds.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from execgate.executor.core import clock
from execgate.executor.core.approval import Approval, ApprovalState

from ..records import PolicyRecord
from .db import Conn, PgDb

COLUMNS = (
    "id, run_id, call_id, batch_id, tool, arguments_json, requester, rule_id, reason, "
    "approvers_json, created_at, expires_at, state, decided_by, comment, decided_at, "
    "idempotency_key, timeout, workspace"
)


class PgApprovals:
    """The approvals of a PostgreSQL journal (`base.ApprovalStore`)."""

    def __init__(
        self,
        db: PgDb,
        daemon_id: int,
        notify: Callable[[Conn, str], Awaitable[None]] | None = None,
    ) -> None:
        self._db = db
        self._me = daemon_id
        # notices.PgNotices.approval_changed, set by the store (None: nobody to tell).
        self.notify = notify

    async def insert(self, approval: Approval, decision: PolicyRecord | None) -> None:
        async def write(conn: Conn) -> None:
            await self._insert(conn, approval, decision)
            if self.notify is not None:  # other daemons' Watch streams show it
                await self.notify(conn, approval.id)

        await self._db.write(write, durable=True)

    async def transition(
        self, approval_id: str, state: ApprovalState, by: str, comment: str
    ) -> Approval | None:
        async def write(conn: Conn) -> Approval | None:
            cur = await conn.execute(
                f"UPDATE approvals SET state=%s, decided_by=%s, comment=%s, decided_at=%s "
                f"WHERE id=%s AND state='pending' RETURNING {COLUMNS}",
                (state.value, by, comment, clock.now(), approval_id),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            if self.notify is not None:
                await self.notify(conn, approval_id)
            return approval_of(row)

        return await self._db.write(write, durable=True)

    async def get(self, approval_id: str) -> Approval | None:
        found = await self._select("WHERE id = %s", (approval_id,))
        return found[0] if found else None

    async def parked(self, run_id: str, call_id: str) -> Approval | None:
        found = await self._select(
            "WHERE run_id = %s AND call_id = %s AND state = 'pending'", (run_id, call_id)
        )
        return found[0] if found else None

    async def pending(self) -> list[Approval]:
        return await self._select("WHERE state = 'pending' ORDER BY created_at", ())

    async def of_run(self, run_id: str) -> list[Approval]:
        return await self._select("WHERE run_id = %s ORDER BY created_at", (run_id,))

    def left_pending(self) -> list[Approval]:
        """At startup: the pending approvals no live daemon holds, now this daemon's."""

        async def claim(conn: Conn) -> list[Approval]:
            cur = await conn.execute(
                f"UPDATE approvals a SET daemon = %s WHERE state = 'pending' AND NOT EXISTS "
                f"(SELECT 1 FROM daemons d WHERE d.id = a.daemon AND d.state = 'alive' "
                f"AND d.id != %s) RETURNING {COLUMNS}",
                (self._me, self._me),
            )
            found = [approval_of(r) for r in await cur.fetchall()]
            return sorted(found, key=lambda a: a.created_at)

        return self._db.write_sync(claim, durable=True)

    async def _select(self, where: str, params: tuple[object, ...]) -> list[Approval]:
        async def read(conn: Conn) -> list[Approval]:
            cur = await conn.execute(f"SELECT {COLUMNS} FROM approvals {where}", params)
            return [approval_of(r) for r in await cur.fetchall()]

        return await self._db.read(read)

    async def _insert(self, conn: Conn, a: Approval, decision: PolicyRecord | None) -> None:
        await conn.execute(
            f"INSERT INTO approvals ({COLUMNS}, decision_json, daemon) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (id) DO NOTHING",
            (
                a.id,
                a.run_id,
                a.call_id,
                a.batch_id,
                a.tool,
                a.arguments_json,
                a.requester,
                a.rule_id,
                a.reason,
                json.dumps(a.approvers),
                a.created_at,
                a.expires_at,
                a.state.value,
                a.decided_by,
                a.comment,
                a.decided_at,
                a.idempotency_key,
                a.timeout,
                a.workspace,
                decision.to_json() if decision is not None else None,
                self._me,
            ),
        )


def approval_of(r: tuple[Any, ...]) -> Approval:
    return Approval(
        id=r[0],
        run_id=r[1],
        call_id=r[2],
        batch_id=r[3],
        tool=r[4],
        arguments_json=r[5],
        requester=r[6],
        rule_id=r[7],
        reason=r[8],
        approvers=tuple(json.loads(r[9])),
        created_at=r[10],
        expires_at=r[11],
        state=ApprovalState(r[12]),
        decided_by=r[13],
        comment=r[14],
        decided_at=r[15],
        idempotency_key=r[16],
        timeout=r[17],
        workspace=r[18],
    )
