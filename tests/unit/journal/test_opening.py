"""Which journal a daemon opens, how its address is shown, and the lock table's notices."""

from __future__ import annotations

from pathlib import Path

import pytest

from execgate.executor.core.errors import ConfigError
from execgate.executor.journal.opening import is_postgresql, open_journal, redacted
from execgate.executor.journal.pg.locktable import MAX_TOLD, notice, told
from execgate.executor.journal.store import Journal


def test_no_journal_flag_is_sqlite_in_the_state_dir(tmp_path: Path) -> None:
    journal = open_journal("", tmp_path / "journal.db")
    try:
        assert isinstance(journal, Journal)
        assert (tmp_path / "journal.db").exists()
    finally:
        journal.close()


@pytest.mark.parametrize("spec", ["/var/lib/journal.db", "sqlite:x.db", "mysql://h/db"])
def test_anything_but_a_postgresql_url_is_refused_naming_the_flag(
    tmp_path: Path, spec: str
) -> None:
    with pytest.raises(ConfigError, match="--journal"):
        open_journal(spec, tmp_path / "journal.db")
    assert not is_postgresql(spec)


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ("postgresql://eg:s3cret@db:5432/execgate", "postgresql://eg:***@db:5432/execgate"),
        ("postgres://eg@db/execgate", "postgres://eg@db/execgate"),
        (
            "postgresql:///eg?host=/run/pg&password=s3cret",
            "postgresql:///eg?host=/run/pg&password=***",
        ),
        ("host=db password=s3cret dbname=eg", "host=db password=*** dbname=eg"),
    ],
)
def test_a_password_never_shows(spec: str, shown: str) -> None:
    assert redacted(spec) == shown
    assert "s3cret" not in redacted(spec)


def test_a_lock_notice_names_its_space_and_the_tickets_granted() -> None:
    assert told(notice("ws-1", {3, 1}), "ws-1") == frozenset({1, 3})
    assert told(notice("ws-1", None), "ws-1") == frozenset()
    assert told(notice("ws-1", {1}), "ws-2") is None
    # Too many to name: no tickets, and every waiting daemon runs a pass of its own.
    assert notice("ws-1", set(range(MAX_TOLD + 1))) == "ws-1"
    assert len(notice("a" * 100, set(range(10**9, 10**9 + MAX_TOLD)))) < 8000
