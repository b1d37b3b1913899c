"""The PostgreSQL journal's tables, and the migrations that make and change them.

The same record kinds as the SQLite journal (journal/schema.py), and what several
daemons sharing one database need besides: `daemons` (each daemon's presence and
lease: presence.py), the `daemon` that runs each call and parks each approval (so
that only a dead daemon's calls are recovered, and by whom), and `lock_entries`
(the lock table of `--locks postgresql`: locktable.py).

Versioned by the one row of `execgate_schema`. `MIGRATIONS` is an ordered list; each
step runs once, in one transaction with setting the version, under a transaction-level
advisory lock, so daemons started together migrate once, one after the other. A
database with a version above this daemon's is refused, untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from ..schema import JournalTooNew

# Advisory lock namespaces (the first key of the two-int form): one per purpose, so
# no lock of one kind is mistaken for another. 0x4547 is "EG".
NS_MIGRATE = 0x45470001
NS_PRESENCE = 0x45470002
NS_LOCKS = 0x45470003

_TABLES = """
CREATE TABLE execgate_schema (version integer NOT NULL);
INSERT INTO execgate_schema VALUES (0);
-- Every daemon that joined, its lease (renewed by its heartbeat) and how it ended.
-- A daemon is alive while state = 'alive'; another daemon ends it (state 'reaped')
-- once its lease ran out, or once the session holding its presence lock is gone.
CREATE TABLE daemons (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL,
    started_at  double precision NOT NULL,
    -- When its presence session took its advisory lock (server clock).
    session_at  timestamptz NOT NULL,
    lease_until timestamptz NOT NULL,
    state       text NOT NULL CHECK (state IN ('alive', 'stopped', 'reaped')),
    ended_at    double precision,
    ended_by    bigint
);
CREATE INDEX daemons_alive ON daemons (id) WHERE state = 'alive';
CREATE TABLE calls (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id          text NOT NULL,
    call_id         text NOT NULL,
    batch_id        text NOT NULL,
    tool            text NOT NULL,
    arguments_json  text NOT NULL,
    request_hash    text NOT NULL,
    idempotency_key text,
    agent           text NOT NULL,
    may_write       boolean NOT NULL,
    state           text NOT NULL CHECK (state IN ('running', 'finished')),
    created_at      double precision NOT NULL,
    finished_at     double precision,
    status          text,
    outcome_json    text,
    raw_result      text,
    replay_of       text,
    decision_json   text,
    -- The daemon that runs (ran) the call: only its death makes the call interrupted.
    daemon          bigint,
    CONSTRAINT calls_run_call UNIQUE (run_id, call_id)
);
CREATE UNIQUE INDEX calls_idempotency ON calls (agent, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX calls_running ON calls (daemon) WHERE state = 'running';
CREATE INDEX calls_created ON calls (created_at);
CREATE INDEX calls_agent ON calls (agent, seq);
CREATE INDEX calls_run ON calls (run_id, seq);
CREATE TABLE refusals (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          double precision NOT NULL,
    run_id      text NOT NULL,
    call_id     text NOT NULL,
    tool        text NOT NULL,
    error_class text NOT NULL,
    message     text NOT NULL
);
CREATE TABLE cancels (
    seq       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        double precision NOT NULL,
    requester text NOT NULL,
    reason    text NOT NULL,
    run_id    text NOT NULL,
    batch_id  text NOT NULL,
    call_id   text NOT NULL,
    grace     double precision
);
CREATE INDEX cancels_runs ON cancels (run_id, at) WHERE call_id = '' AND batch_id = '';
CREATE TABLE policy_events (
    seq      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       double precision NOT NULL,
    source   text NOT NULL,
    revision text NOT NULL,
    accepted boolean NOT NULL,
    message  text NOT NULL
);
CREATE TABLE approvals (
    id              text PRIMARY KEY,
    run_id          text NOT NULL,
    call_id         text NOT NULL,
    batch_id        text NOT NULL,
    tool            text NOT NULL,
    arguments_json  text NOT NULL,
    requester       text NOT NULL,
    rule_id         text NOT NULL,
    reason          text NOT NULL,
    approvers_json  text NOT NULL,
    created_at      double precision NOT NULL,
    expires_at      double precision NOT NULL,
    state           text NOT NULL
        CHECK (state IN ('pending', 'approved', 'denied', 'expired')),
    decided_by      text NOT NULL DEFAULT '',
    comment         text NOT NULL DEFAULT '',
    decided_at      double precision,
    decision_json   text,
    idempotency_key text NOT NULL DEFAULT '',
    timeout         double precision,
    -- The daemon the call is parked on (it runs the call once approved).
    daemon          bigint
);
CREATE INDEX approvals_pending ON approvals (created_at) WHERE state = 'pending';
CREATE INDEX approvals_run ON approvals (run_id, created_at);
CREATE TABLE runs (
    run_id           text PRIMARY KEY,
    goal             text NOT NULL,
    owner            text NOT NULL,
    limits_json      text NOT NULL,
    model            text NOT NULL,
    config_version   text NOT NULL,
    labels_json      text NOT NULL,
    state            text NOT NULL,
    reason           text NOT NULL,
    last_seq         integer NOT NULL,
    created_at       double precision NOT NULL,
    updated_at       double precision NOT NULL,
    cancel_requester text,
    cancel_reason    text,
    cancel_at        double precision
);
CREATE INDEX runs_created ON runs (created_at);
CREATE TABLE run_events (
    run_id     text NOT NULL,
    seq        integer NOT NULL,
    at         double precision NOT NULL,
    from_state text NOT NULL,
    to_state   text NOT NULL,
    reason     text NOT NULL,
    data_json  text NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE spans (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trace_id        text NOT NULL,
    span_id         text NOT NULL,
    parent_id       text NOT NULL,
    name            text NOT NULL,
    start           double precision NOT NULL,
    "end"           double precision NOT NULL,
    status          text NOT NULL,
    run_id          text NOT NULL,
    call_id         text NOT NULL,
    attributes_json text NOT NULL,
    events_json     text NOT NULL
);
CREATE INDEX spans_trace ON spans (trace_id);
CREATE INDEX spans_run ON spans (run_id) WHERE run_id != '';
-- The lock table of --locks postgresql (locktable.py): one row per waiting or granted
-- plan, in the lock space its daemons share. Its critical section is a
-- transaction-level advisory lock per space.
CREATE TABLE lock_entries (
    ticket  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    space   text NOT NULL,
    daemon  bigint NOT NULL,
    owner   text NOT NULL,
    plan    text NOT NULL,
    granted boolean NOT NULL DEFAULT false,
    flow    text NOT NULL DEFAULT '',
    cap     integer NOT NULL DEFAULT 0,
    tag     bigint NOT NULL DEFAULT 0
);
CREATE INDEX lock_entries_space ON lock_entries (space, tag, ticket);
CREATE INDEX lock_entries_daemon ON lock_entries (daemon);
"""

Conn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True)
class Migration:
    version: int
    what: str
    apply: Callable[[Conn], Awaitable[None]]


async def _tables(conn: Conn) -> None:
    await conn.execute(_TABLES)  # no parameters: several statements in one go


# Calls, runs and parked calls name the workspace they work in (SQLite's version 3);
# everything recorded before there were several worked in the daemons' --workspace.
_WORKSPACES = """
ALTER TABLE calls ADD COLUMN workspace text NOT NULL DEFAULT 'default';
ALTER TABLE runs ADD COLUMN workspace text NOT NULL DEFAULT 'default';
ALTER TABLE approvals ADD COLUMN workspace text NOT NULL DEFAULT 'default';
"""


async def _workspaces(conn: Conn) -> None:
    await conn.execute(_WORKSPACES)


# In order; each runs once. A new one is appended (never edited once released).
MIGRATIONS = (
    Migration(1, "the journal's tables", _tables),
    Migration(2, "the workspace of calls, runs and approvals", _workspaces),
)
LATEST = MIGRATIONS[-1].version


async def version(conn: Conn) -> int:
    cur = await conn.execute("SELECT to_regclass('execgate_schema') IS NOT NULL")
    row = await cur.fetchone()
    if row is None or not row[0]:
        return 0
    cur = await conn.execute("SELECT version FROM execgate_schema")
    found = await cur.fetchone()
    return int(found[0]) if found is not None else 0


async def migrate(conn: Conn) -> list[Migration]:
    """Bring the database to LATEST; the migrations applied (each in its own transaction)."""
    applied: list[Migration] = []
    for step in MIGRATIONS:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (NS_MIGRATE,))
            found = await version(conn)
            if found > LATEST:
                raise JournalTooNew(found, LATEST)
            if step.version <= found:
                continue
            await step.apply(conn)
            await conn.execute("UPDATE execgate_schema SET version = %s", (step.version,))
            applied.append(step)
    if not applied:
        async with conn.transaction():
            found = await version(conn)
            if found > LATEST:
                raise JournalTooNew(found, LATEST)
    return applied
