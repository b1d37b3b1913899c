"""The journal versions itself (PRAGMA user_version) and migrates in order.

The old journal here was written by a real daemon from before versioning
(tests/fixtures/journal_unversioned.sql); today's daemon must open it, keep its
calls readable and their idempotency keys binding, and refuse a journal from a
newer daemon with a clear message instead of touching it.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from execgate.client import Call, Client, Status
from execgate.executor.journal import schema as journal_schema
from execgate.executor.journal.schema import LATEST, Migration, migrate
from execgate.executor.server.config import JOURNAL_NAME
from tests.daemon import Daemon

SERVE = [sys.executable, "-m", "execgate.executor.cli", "serve"]
OLD = Path(__file__).parents[1] / "fixtures" / "journal_unversioned.sql"


def _old_journal(state: Path) -> Path:
    state.mkdir(parents=True, mode=0o700)
    path = state / JOURNAL_NAME
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD.read_text())
    return path


def _dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [*conn.iterdump(), str(conn.execute("PRAGMA user_version").fetchone()[0])]
    finally:
        conn.close()


def _version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def test_a_daemon_opens_a_journal_the_previous_schema_wrote(tmp_path: Path) -> None:
    path = _old_journal(tmp_path / "state")
    assert _version(path) == 0
    d = Daemon(tmp_path).start()
    try:
        with Client(d.address) as c:
            old = c.get_call("old-write", run_id="old-run")
            assert old.outcome is not None
            assert old.outcome.status is Status.SUCCESS
            refused = c.get_call("old-escape", run_id="old-run")
            assert refused.outcome is not None
            assert refused.outcome.field == "arguments.path"
            # The old call's idempotency key still binds: the same key replays it.
            (replayed,) = c.execute(
                [
                    Call(
                        tool="write_file",
                        arguments={"path": "b.txt", "content": "written by the old daemon"},
                        call_id="new-write",
                        idempotency_key="old-key",
                    )
                ],
                run_id="old-run",
            )
            assert replayed.replay_of == "old-write"
            (fresh,) = c.execute([Call(tool="list_dir", arguments={"path": "."})])
            assert fresh.status is Status.SUCCESS
    finally:
        d.stop()
    assert _version(path) == LATEST
    assert "migrated to schema 2" in d.log()
    with sqlite3.connect(path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(calls)")}
    assert "decision_json" in columns


def test_a_journal_from_a_newer_daemon_is_refused_untouched(tmp_path: Path) -> None:
    path = _old_journal(tmp_path / "state")
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    before = _dump(path)
    ran = subprocess.run(
        [*SERVE, "--state-dir", str(tmp_path / "state"), "--workspace", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode != 0
    assert f"version {LATEST + 1}, newer than this daemon's {LATEST}" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert _dump(path) == before  # (only its journal mode may have been set to WAL)


def test_each_migration_runs_once_and_a_failing_one_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = sqlite3.connect(tmp_path / "j.db", isolation_level=None)
    assert [m.version for m in migrate(conn)] == list(range(1, LATEST + 1))
    assert migrate(conn) == []

    def broken(c: sqlite3.Connection) -> None:
        c.execute("CREATE TABLE half_done (x)")
        raise sqlite3.OperationalError("disk on fire")

    steps = (*journal_schema.MIGRATIONS, Migration(LATEST + 1, "broken", broken))
    monkeypatch.setattr(journal_schema, "MIGRATIONS", steps)
    monkeypatch.setattr(journal_schema, "LATEST", LATEST + 1)
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn)
    assert int(conn.execute("PRAGMA user_version").fetchone()[0]) == LATEST
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "half_done" not in tables
    conn.close()
