"""The `approvals` table: rows in and out (executor/pipeline/approve.py decides what they say)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from execgate.executor.core.approval import Approval, ApprovalState

from .store import Journal, PolicyRecord

_COLUMNS = (
    "id, run_id, call_id, batch_id, tool, arguments_json, requester, rule_id, reason, "
    "approvers_json, created_at, expires_at, state, decided_by, comment, decided_at, "
    "idempotency_key, timeout"
)


def insert(conn: sqlite3.Connection, a: Approval, decision: PolicyRecord | None) -> None:
    conn.execute(
        f"INSERT INTO approvals ({_COLUMNS}, decision_json) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            decision.to_json() if decision is not None else None,
        ),
    )


def rows(conn: sqlite3.Connection, where: str, params: tuple[object, ...]) -> list[Approval]:
    rows = conn.execute(f"SELECT {_COLUMNS} FROM approvals {where}", params).fetchall()
    return [_approval(r) for r in rows]


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
    )


def left_pending(journal: Journal) -> list[Approval]:
    """At startup: the approvals a previous daemon left pending, oldest first."""
    return journal.write_now(lambda c: rows(c, "WHERE state = 'pending' ORDER BY created_at", ()))
