"""The journal's tables, and the changes an older journal gets when a newer daemon opens it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from execgate.executor.core.errors import ConfigError

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    -- No AUTOINCREMENT: it writes sqlite_sequence on every insert. Rows are never
    -- deleted, so rowid order is insertion order all the same.
    seq             INTEGER PRIMARY KEY,
    run_id          TEXT NOT NULL,
    call_id         TEXT NOT NULL,
    batch_id        TEXT NOT NULL,
    tool            TEXT NOT NULL,
    arguments_json  TEXT NOT NULL,
    request_hash    TEXT NOT NULL,
    idempotency_key TEXT,
    agent           TEXT NOT NULL,
    may_write       INTEGER NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('running', 'finished')),
    created_at      REAL NOT NULL,
    finished_at     REAL,
    status          TEXT,
    outcome_json    TEXT,
    raw_result      TEXT,
    replay_of       TEXT,
    -- The policy decision: effect, rule ids, revision, shadow rules (JSON).
    decision_json   TEXT,
    -- The workspace it worked in (as the request named it, if it was refused for it).
    workspace       TEXT NOT NULL DEFAULT 'default',
    UNIQUE (run_id, call_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS calls_idempotency
    ON calls (agent, idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Only recovery looks for running calls, and there are few: a partial index.
CREATE INDEX IF NOT EXISTS calls_running ON calls (state) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS calls_created ON calls (created_at);
CREATE INDEX IF NOT EXISTS calls_agent ON calls (agent, seq);
CREATE TABLE IF NOT EXISTS refusals (
    seq         INTEGER PRIMARY KEY,
    at          REAL NOT NULL,
    run_id      TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    tool        TEXT NOT NULL,
    error_class TEXT NOT NULL,
    message     TEXT NOT NULL
);
-- Every Cancel request, recorded before anything is signalled. A row without
-- call_id and batch_id cancels its whole run: no later call of it starts.
CREATE TABLE IF NOT EXISTS cancels (
    seq       INTEGER PRIMARY KEY,
    at        REAL NOT NULL,
    requester TEXT NOT NULL,
    reason    TEXT NOT NULL,
    run_id    TEXT NOT NULL,
    batch_id  TEXT NOT NULL,
    call_id   TEXT NOT NULL,
    grace     REAL
);
-- Every policy file a running daemon was shown: accepted (now in force) or refused
-- (the last good one stayed in force), with the file:line:column reason.
CREATE TABLE IF NOT EXISTS policy_events (
    seq      INTEGER PRIMARY KEY,
    at       REAL NOT NULL,
    source   TEXT NOT NULL,
    revision TEXT NOT NULL,
    accepted INTEGER NOT NULL,
    message  TEXT NOT NULL
);
-- Calls a policy `ask` rule parked (see executor/pipeline/approve.py). A row is written
-- (durably) before the call's awaiting_approval event is sent, and its decision
-- before the call goes on. Rows are never deleted.
CREATE TABLE IF NOT EXISTS approvals (
    id             TEXT PRIMARY KEY,
    run_id         TEXT NOT NULL,
    call_id        TEXT NOT NULL,
    batch_id       TEXT NOT NULL,
    tool           TEXT NOT NULL,
    arguments_json TEXT NOT NULL,
    requester      TEXT NOT NULL,
    rule_id        TEXT NOT NULL,
    reason         TEXT NOT NULL,
    approvers_json TEXT NOT NULL,
    created_at     REAL NOT NULL,
    expires_at     REAL NOT NULL,
    state          TEXT NOT NULL
        CHECK (state IN ('pending', 'approved', 'denied', 'expired')),
    decided_by     TEXT NOT NULL DEFAULT '',
    comment        TEXT NOT NULL DEFAULT '',
    decided_at     REAL,
    -- The call's policy decision (as in calls.decision_json).
    decision_json  TEXT,
    -- The rest of the request, so a daemon started after this one can run the
    -- call once it is approved (approvals outlive the daemon; see approve.py).
    idempotency_key TEXT NOT NULL DEFAULT '',
    timeout         REAL,
    workspace       TEXT NOT NULL DEFAULT 'default'
);
CREATE INDEX IF NOT EXISTS approvals_pending ON approvals (state) WHERE state = 'pending';
-- Agent loops (executor/runs/registry.py): one row per run, its state kept in step with its
-- last event; events are the state machine's transitions, seq 1, 2, ... per run.
CREATE TABLE IF NOT EXISTS runs (
    run_id           TEXT PRIMARY KEY,
    goal             TEXT NOT NULL,
    owner            TEXT NOT NULL,
    limits_json      TEXT NOT NULL,
    model            TEXT NOT NULL,
    config_version   TEXT NOT NULL,
    labels_json      TEXT NOT NULL,
    state            TEXT NOT NULL,
    reason           TEXT NOT NULL,
    last_seq         INTEGER NOT NULL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    cancel_requester TEXT,
    cancel_reason    TEXT,
    cancel_at        REAL,
    -- The workspace its calls work in (Runs.StartRun binds it).
    workspace        TEXT NOT NULL DEFAULT 'default'
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at);
CREATE TABLE IF NOT EXISTS run_events (
    run_id     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    at         REAL NOT NULL,
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    reason     TEXT NOT NULL,
    data_json  TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
-- OpenTelemetry spans (executor/telemetry/tracing.py), so traces need no collector. A view of
-- the calls' own records, written without fsync; run_id/call_id from the attributes.
CREATE TABLE IF NOT EXISTS spans (
    seq             INTEGER PRIMARY KEY,
    trace_id        TEXT NOT NULL,
    span_id         TEXT NOT NULL,
    parent_id       TEXT NOT NULL,
    name            TEXT NOT NULL,
    start           REAL NOT NULL,
    end             REAL NOT NULL,
    status          TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    call_id         TEXT NOT NULL,
    attributes_json TEXT NOT NULL,
    events_json     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS spans_trace ON spans (trace_id);
CREATE INDEX IF NOT EXISTS spans_run ON spans (run_id) WHERE run_id != '';
"""

RECORD_COLUMNS = (
    "run_id, call_id, batch_id, tool, arguments_json, request_hash, idempotency_key, agent, "
    "may_write, state, created_at, outcome_json, replay_of, decision_json, workspace"
)


class JournalTooNew(ConfigError):
    """The journal was written by a newer daemon: opening it could lose what it records.
    `found` is its schema version, `latest` this daemon's."""

    def __init__(self, found: int, latest: int) -> None:
        super().__init__(
            f"the journal's schema is version {found}, newer than this daemon's {latest}: "
            "it was written by a newer execgate; run that version (or a newer one) on it"
        )
        self.found = found
        self.latest = latest


@dataclass(frozen=True)
class Migration:
    version: int
    what: str
    apply: Callable[[sqlite3.Connection], None]


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _unversioned(conn: sqlite3.Connection) -> None:
    # Journals from before versioning (user_version 0) may lack columns added since.
    if "decision_json" not in _columns(conn, "calls"):
        conn.execute("ALTER TABLE calls ADD COLUMN decision_json TEXT")
    if "idempotency_key" not in _columns(conn, "approvals"):
        conn.execute("ALTER TABLE approvals ADD COLUMN idempotency_key TEXT NOT NULL DEFAULT ''")
        conn.execute("ALTER TABLE approvals ADD COLUMN timeout REAL")


def _calls_by_agent(conn: sqlite3.Connection) -> None:
    # An agent lists its own calls (results are scoped to their agent), newest first.
    conn.execute("CREATE INDEX IF NOT EXISTS calls_agent ON calls (agent, seq)")


def _workspaces(conn: sqlite3.Connection) -> None:
    # Calls, runs and parked calls name the workspace they work in; everything recorded
    # before there were several worked in the daemon's --workspace, `default`.
    for table in ("calls", "runs", "approvals"):
        if "workspace" not in _columns(conn, table):
            conn.execute(
                f"ALTER TABLE {table} ADD COLUMN workspace TEXT NOT NULL DEFAULT 'default'"
            )


# In order; each runs once, in its own transaction, and sets PRAGMA user_version.
# A new one is appended here (never edited once released) and SCHEMA shows the result.
MIGRATIONS = (
    Migration(1, "columns added before the journal was versioned", _unversioned),
    Migration(2, "index calls by agent", _calls_by_agent),
    Migration(3, "the workspace of calls, runs and approvals", _workspaces),
)
LATEST = MIGRATIONS[-1].version


def version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection) -> list[Migration]:
    """Bring a journal (new, unversioned or older) to LATEST; the migrations applied."""
    found = version(conn)
    if found > LATEST:
        raise JournalTooNew(found, LATEST)
    conn.executescript(SCHEMA)  # every table and index, IF NOT EXISTS: nothing is dropped
    applied = []
    for step in MIGRATIONS:
        if step.version <= found:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            step.apply(conn)
            conn.execute(f"PRAGMA user_version = {step.version:d}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(step)
    return applied
