"""The PostgreSQL journal's migrations: a database an earlier daemon made (schema version
1, before workspaces) is brought to the latest version by the next daemon that opens it,
and what it held reads back in the daemon's `default` workspace; a database from a newer
daemon is refused untouched."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import psycopg
import pytest

from execgate.executor.journal.pg import schema
from execgate.executor.journal.pg.store import PgJournal
from execgate.executor.journal.records import CallFilter
from execgate.executor.journal.schema import JournalTooNew
from tests.pg_support import PgServer, pg_rows


def _database(server: PgServer, request: pytest.FixtureRequest) -> str:
    return server.database("m" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16])


async def _at_version_1(url: str) -> None:
    """The tables as migration 1 made them, holding a call, a run and an approval."""
    conn: psycopg.AsyncConnection[Any] = await psycopg.AsyncConnection.connect(url)
    async with conn:
        async with conn.transaction():
            await schema.MIGRATIONS[0].apply(conn)
            await conn.execute("UPDATE execgate_schema SET version = 1")
        await conn.execute(
            "INSERT INTO calls (run_id, call_id, batch_id, tool, arguments_json, "
            "request_hash, agent, may_write, state, created_at, daemon) "
            "VALUES ('r', 'old', 'b', 'noop', '{}', 'h', 'bot', false, 'running', 1.0, 1)"
        )
        await conn.execute(
            "INSERT INTO runs (run_id, goal, owner, limits_json, model, config_version, "
            "labels_json, state, reason, last_seq, created_at, updated_at) "
            "VALUES ('r', 'g', 'bot', '{}', '', '', '{}', 'created', '', 0, 1.0, 1.0)"
        )
        await conn.execute(
            "INSERT INTO approvals (id, run_id, call_id, batch_id, tool, arguments_json, "
            "requester, rule_id, reason, approvers_json, created_at, expires_at, state) "
            "VALUES ('a', 'r', 'c', 'b', 'noop', '{}', 'bot', 'ask', 'why', '[]', 1.0, 9e9, "
            "'pending')"
        )


def test_a_database_before_workspaces_is_migrated_and_reads_in_default(
    pg_server: PgServer, request: pytest.FixtureRequest
) -> None:
    url = _database(pg_server, request)
    asyncio.run(_at_version_1(url))
    j = PgJournal(url, lease=5.0)
    try:
        assert pg_rows(url, "SELECT version FROM execgate_schema") == [(schema.LATEST,)]
        assert j.runs.workspaces() == {"r": "default"}

        async def reads() -> tuple[Any, ...]:
            listed, _ = await j.list(CallFilter(workspace="default"))
            elsewhere, _ = await j.list(CallFilter(workspace="home"))
            approval = await j.approvals.get("a")
            run = await j.runs.get("r")
            return [c.call_id for c in listed], elsewhere, approval, run

        listed, elsewhere, approval, run = asyncio.run(reads())
    finally:
        j.close()
    assert listed == ["old"]
    assert elsewhere == []
    assert approval is not None
    assert approval.workspace == "default"
    assert run is not None
    assert run.workspace == "default"


def test_a_database_a_newer_daemon_migrated_is_refused_untouched(
    pg_server: PgServer, request: pytest.FixtureRequest
) -> None:
    url = _database(pg_server, request)
    PgJournal(url, lease=5.0).close()
    newer = schema.LATEST + 1
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE execgate_schema SET version = %s", (newer,))
    with pytest.raises(JournalTooNew):
        PgJournal(url, lease=5.0)
    assert pg_rows(url, "SELECT version FROM execgate_schema") == [(newer,)]
