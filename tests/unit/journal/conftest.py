"""A real journal of each kind -- SQLite in the test's temporary directory, PostgreSQL in
a database of the session's throwaway server (tests/pg_support.py) -- and a way to read
its tables behind the stores' backs, to check what they wrote."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from execgate.executor.journal.base import JournalStore
from execgate.executor.journal.store import Journal
from tests.pg_support import PgServer


@dataclass(frozen=True)
class Where:
    """Where a test's journal lives: a SQLite file, or a PostgreSQL database."""

    kind: str
    sqlite: Path
    url: str = ""


@pytest.fixture(params=["sqlite", "postgresql"])
def path(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    if request.param == "sqlite":
        return Where("sqlite", tmp_path / "journal.db")
    server: PgServer = request.getfixturevalue("pg_server")
    name = "u" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    return Where("postgresql", tmp_path / "unused.db", server.database(name))


def open_at(where: Where) -> JournalStore:
    """Open the journal (a daemon starting on it)."""
    if where.kind == "sqlite":
        return Journal(where.sqlite)
    from execgate.executor.journal.pg.store import PgJournal

    return PgJournal(where.url, lease=5.0)


@pytest.fixture
def journal(path: Where) -> Iterator[Any]:
    j = open_at(path)
    try:
        yield j
    finally:
        j.close()


def rows(where: Where, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run `query` (SQLite's ? placeholders) read-only, outside the stores."""
    if where.kind == "postgresql":
        import psycopg

        with psycopg.connect(where.url) as conn:
            return [tuple(r) for r in conn.execute(query.replace("?", "%s"), params).fetchall()]
    conn = sqlite3.connect(f"file:{where.sqlite}?mode=ro", uri=True)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()
