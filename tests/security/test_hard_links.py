"""Hard links: a file inside the workspace that is another name of a file outside it.

A hard link planted by a command (or checked out with a tree) passes every path
check, since the name is inside. Its link count gives it away: regular files with
more than one link are treated as outside unless the policy's `hard_links:` globs
allow them there. Each tool that opens files is tried; the outside file must come
back unread and unchanged, and the refusal must say why.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client, Outcome, Status
from tests.daemon import Daemon

SECRET = "OUTSIDE-" + uuid.uuid4().hex
POLICY = """\
version: 1
default: allow
hard_links: ["vendor/**"]
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("hardlinks")
    (root / "policy.yaml").write_text(POLICY)
    d = Daemon(root, "--policy", str(root / "policy.yaml")).start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def eg(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.address) as c:
        yield c


def planted(daemon: Daemon, name: str, content: bytes | None = None) -> tuple[str, Path]:
    """An outside file, and a hard link to it at `name` inside the workspace."""
    outside = daemon.root / f"outside-{uuid.uuid4().hex[:8]}"
    outside.write_bytes(content if content is not None else f"{SECRET}\n".encode())
    inside = daemon.workspace / name
    inside.parent.mkdir(parents=True, exist_ok=True)
    os.link(outside, inside)
    return name, outside


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(eg: Client, out: Outcome, field: str) -> None:
    assert (out.status, out.error_class, out.field) == (
        Status.FAILURE,
        "permission_denied",
        field,
    ), out
    assert "hard link" in out.message, out.message
    assert SECRET not in out.text
    record = eg.get_call(out.call_id)
    assert record.outcome is not None
    assert record.outcome.status is out.status


def test_read_file_refuses_a_hard_link(eg: Client, daemon: Daemon) -> None:
    name, _ = planted(daemon, "r/secret.txt")
    refused(eg, eg.execute_one("read_file", path=name), "arguments.path")


def test_edit_file_refuses_a_hard_link(eg: Client, daemon: Daemon) -> None:
    name, outside = planted(daemon, "e/secret.txt")
    before = digest(outside)
    out = eg.execute_one("edit_file", path=name, old_string="OUTSIDE", new_string="changed")
    refused(eg, out, "arguments.path")
    assert digest(outside) == before


def test_write_file_refuses_a_hard_link(eg: Client, daemon: Daemon) -> None:
    name, outside = planted(daemon, "w/secret.txt")
    before = digest(outside)
    out = eg.execute_one("write_file", path=name, content="replaced")
    refused(eg, out, "arguments.path")
    assert not out.evidence.sha256_before  # not even the hash of the outside file
    assert digest(outside) == before


def test_search_skips_hard_links_and_says_so(eg: Client, daemon: Daemon) -> None:
    planted(daemon, "s/secret.txt")
    (daemon.workspace / "s" / "plain.txt").write_text(f"plain {SECRET[:8]}\n")
    out = eg.execute_one("search", pattern="OUTSIDE", path="s")
    assert out.status is Status.SUCCESS, out
    assert SECRET not in out.text
    assert "plain.txt" in out.text
    assert out.structured["skipped_hard_links"] == 1
    one = eg.execute_one("search", pattern="OUTSIDE", path="s/secret.txt")
    assert SECRET not in one.text
    assert one.structured["skipped_hard_links"] == 1


def _database(path: Path, value: str, *, wal: bool = False) -> None:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE secret(value TEXT)")
    conn.execute("INSERT INTO secret VALUES (?)", (value,))
    conn.commit()
    conn.close()


def test_sql_refuses_a_hard_linked_database(eg: Client, daemon: Daemon) -> None:
    outside = daemon.root / f"outside-{uuid.uuid4().hex[:8]}.db"
    _database(outside, SECRET)
    before = digest(outside)
    (daemon.workspace / "q").mkdir()
    os.link(outside, daemon.workspace / "q" / "db.sqlite")
    read = eg.execute_one("sql", database="q/db.sqlite", query="SELECT value FROM secret")
    refused(eg, read, "arguments.database")
    write = eg.execute_one(
        "sql", database="q/db.sqlite", query="UPDATE secret SET value = 'changed'"
    )
    refused(eg, write, "arguments.database")
    assert digest(outside) == before


def test_sql_refuses_a_hard_linked_journal_file(eg: Client, daemon: Daemon) -> None:
    """The database is a real inside file; its WAL is planted as a link to the outside."""
    (daemon.workspace / "j").mkdir()
    _database(daemon.workspace / "j" / "db.sqlite", "inside", wal=True)
    _, outside = planted(daemon, "j/db.sqlite-wal", b"")
    out = eg.execute_one("sql", database="j/db.sqlite", query="INSERT INTO secret VALUES ('x')")
    assert out.status is Status.FAILURE, out
    assert out.error_class == "permission_denied", out
    assert "hard link" in out.message, out.message
    assert outside.read_bytes() == b""  # nothing written into the outside file


def test_the_policy_allows_hard_links_where_it_says(eg: Client, daemon: Daemon) -> None:
    name, outside = planted(daemon, "vendor/pkg/lib.txt")
    out = eg.execute_one("read_file", path=name)
    assert out.status is Status.SUCCESS, out
    assert SECRET in out.text  # the operator said hard links are fine under vendor/
    found = eg.execute_one("search", pattern="OUTSIDE", path="vendor")
    assert SECRET in found.text
    assert "skipped_hard_links" not in json.dumps(found.structured)
    # ...and nowhere else.
    other, _ = planted(daemon, "notvendor/lib.txt")
    refused(eg, eg.execute_one("read_file", path=other), "arguments.path")
    assert outside.exists()
