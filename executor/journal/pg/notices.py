"""Notices between the daemons sharing a PostgreSQL journal (`base.NoticeStore`).

A write other daemons must act on sends a NOTIFY on `execgate_records` in its own
transaction, so it is delivered only if, and as soon as, the write commits. The
payload is JSON naming the sender; a daemon ignores its own (it acted already, in
process). NOTIFY is not durable: a daemon whose presence session was down gets
`RESYNC` and re-reads what it waits for.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import asdict

from execgate.executor.core.approval import Approval

from ..records import CancelRecord, Notice, NoticeKind
from .db import Conn
from .presence import RECORDS_CHANNEL, Presence, send_notice

log = logging.getLogger("execgate.journal")


class PgNotices:
    """Sends and receives notices through `presence`'s session."""

    def __init__(self, presence: Presence) -> None:
        self._me = presence.daemon_id
        # (subscriber, its loop); called on that loop.
        self._subs: list[tuple[Callable[[Notice], None], asyncio.AbstractEventLoop]] = []
        presence.subscribe(RECORDS_CHANNEL, self._received)
        presence.on_lost.append(lambda: self._deliver(Notice(NoticeKind.LEASE_LOST)))
        presence.on_adopted.append(self._adopted)

    def subscribe(self, fn: Callable[[Notice], None]) -> Callable[[], None]:
        entry = (fn, asyncio.get_running_loop())
        self._subs.append(entry)
        return lambda: self._subs.remove(entry) if entry in self._subs else None

    # -- sending (inside the writer's transaction) ------------------------------------------

    async def cancelled(self, conn: Conn, rec: CancelRecord) -> None:
        await self._send(conn, NoticeKind.CANCEL, "", asdict(rec))

    async def approval_changed(self, conn: Conn, approval_id: str) -> None:
        await self._send(conn, NoticeKind.APPROVAL, approval_id)

    async def run_changed(self, conn: Conn, run_id: str) -> None:
        await self._send(conn, NoticeKind.RUN, run_id)

    async def call_ended(self, conn: Conn, agent: str, key: str) -> None:
        await self._send(conn, NoticeKind.CALL, f"{agent}\0{key}")

    async def _send(
        self, conn: Conn, kind: NoticeKind, key: str, cancel: dict[str, object] | None = None
    ) -> None:
        await send_notice(conn, self._me, kind, key, cancel)

    # -- receiving (on the db's loop) -------------------------------------------------------

    def _received(self, payload: str | None) -> None:
        if payload is None:
            self._deliver(Notice(NoticeKind.RESYNC))
            return
        try:
            data = json.loads(payload)
            if data["from"] == self._me:
                return
            cancel = data.get("cancel")
            notice = Notice(
                NoticeKind(data["kind"]),
                data["key"],
                CancelRecord(**cancel) if cancel is not None else None,
            )
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("journal: a notice that does not parse: %s", exc)
            return
        self._deliver(notice)

    def _adopted(self, approvals: list[Approval]) -> None:
        self._deliver(Notice(NoticeKind.ADOPTED, approvals=tuple(approvals)))

    def _deliver(self, notice: Notice) -> None:
        for fn, loop in list(self._subs):
            if not loop.is_closed():
                loop.call_soon_threadsafe(fn, notice)
