"""The `approvals` table: rows in and out (executor/pipeline/approve.py decides what they say).

`SqliteApprovals` implements `base.ApprovalStore`. Every write is durable (fsync
before the await returns): nothing about an approval is reported before it is on
disk. A decision is one conditional UPDATE (`WHERE state='pending'`), so a decision
and an expiry racing each other cannot both win.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from execgate.executor.core import clock
from execgate.executor.core.approval import Approval, ApprovalState

from .db import SqliteDb
from .records import PolicyRecord

_COLUMNS = (
    "id, run_id, call_id, batch_id, tool, arguments_json, requester, rule_id, reason, "
    "approvers_json, created_at, expires_at, state, decided_by, comment, decided_at, "
    "idempotency_key, timeout, workspace"
)


class SqliteApprovals:
    """The approvals of a SQLite journal (`base.ApprovalStore`)."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def insert(self, approval: Approval, decision: PolicyRecord | None) -> None:
        """Write a new (pending) approval, durably."""
        await self._db.write(lambda c: _insert(c, approval, decision), durable=True)

    async def transition(
        self, approval_id: str, state: ApprovalState, by: str, comment: str
    ) -> Approval | None:
        """Move a pending approval to `state`, durably; None if it was not pending."""

        def write(conn: sqlite3.Connection) -> Approval | None:
            updated = conn.execute(
                "UPDATE approvals SET state=?, decided_by=?, comment=?, decided_at=? "
                "WHERE id=? AND state='pending'",
                (state.value, by, comment, clock.now(), approval_id),
            ).rowcount
            if updated != 1:
                return None
            return _rows(conn, "WHERE id = ?", (approval_id,))[0]

        return await self._db.write(write, durable=True)

    async def get(self, approval_id: str) -> Approval | None:
        found = await self._select("WHERE id = ?", (approval_id,))
        return found[0] if found else None

    async def parked(self, run_id: str, call_id: str) -> Approval | None:
        found = await self._select(
            "WHERE run_id = ? AND call_id = ? AND state = 'pending'", (run_id, call_id)
        )
        return found[0] if found else None

    async def pending(self) -> list[Approval]:
        return await self._select("WHERE state = 'pending' ORDER BY created_at", ())

    async def of_run(self, run_id: str) -> list[Approval]:
        return await self._select("WHERE run_id = ? ORDER BY created_at", (run_id,))

    def left_pending(self) -> list[Approval]:
        """At startup: the approvals a previous daemon left pending, oldest first."""
        return self._db.write_sync(
            lambda c: _rows(c, "WHERE state = 'pending' ORDER BY created_at", ()), durable=True
        )

    async def _select(self, where: str, params: tuple[object, ...]) -> list[Approval]:
        return await self._db.read(lambda c: _rows(c, where, params))


def _insert(conn: sqlite3.Connection, a: Approval, decision: PolicyRecord | None) -> None:
    conn.execute(
        f"INSERT INTO approvals ({_COLUMNS}, decision_json) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
        ),
    )


def _rows(conn: sqlite3.Connection, where: str, params: tuple[object, ...]) -> list[Approval]:
    found = conn.execute(f"SELECT {_COLUMNS} FROM approvals {where}", params).fetchall()
    return [_approval(r) for r in found]


def _approval(r: tuple[Any, ...]) -> Approval:
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
