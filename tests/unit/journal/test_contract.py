"""The store interfaces are the journal's contract: the SQLite and the PostgreSQL
journals implement each of them with the same signatures, and no room above the
journal holds SQL."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from execgate.executor.journal import base
from execgate.executor.journal.store import Journal

EXECUTOR = Path(base.__file__).resolve().parents[1]
# The journal's own SQL, and the user's (the sql tool).
NOT_ABOVE = {"journal", "tools", "__pycache__"}


def _members(protocol: type) -> list[str]:
    return sorted(
        name
        for klass in protocol.__mro__
        if klass not in (object,) and getattr(klass, "_is_protocol", False)
        for name in vars(klass)
        if not name.startswith("_")
    )


def _parts(journal: Journal) -> list[tuple[type, Any]]:
    return [
        (base.JournalStore, journal),
        (base.CallStore, journal),
        (base.ApprovalStore, journal.approvals),
        (base.RunRecordStore, journal.runs),
        (base.CancelStore, journal.cancels),
        (base.ReloadStore, journal.reloads),
        (base.SpanStore, journal.spans),
        (base.NoticeStore, journal.notices),
    ]


def test_every_store_interface_is_exported() -> None:
    protocols = [n for n, v in vars(base).items() if isinstance(v, type) and n.endswith("Store")]
    assert sorted(protocols) == sorted(base.__all__)


def test_each_journal_implements_every_store_interface(journal: Journal) -> None:
    for protocol, impl in _parts(journal):
        assert _members(protocol), protocol
        for name in _members(protocol):
            declared = inspect.getattr_static(protocol, name)
            assert hasattr(impl, name), f"{type(impl).__name__} lacks {protocol.__name__}.{name}"
            if isinstance(declared, property):
                continue
            want, got = inspect.signature(declared), inspect.signature(getattr(type(impl), name))
            assert list(got.parameters) == list(want.parameters), (protocol.__name__, name)
            assert inspect.iscoroutinefunction(getattr(impl, name)) == (
                inspect.iscoroutinefunction(declared)
            ), f"{protocol.__name__}.{name}: async in one, not the other"


@pytest.mark.parametrize(
    "room", sorted(p.name for p in EXECUTOR.iterdir() if p.is_dir() and p.name not in NOT_ABOVE)
)
def test_no_room_above_the_journal_holds_sql(room: str) -> None:
    # The filelock backend keeps its own lock table in the shared lock directory, not
    # in the journal.
    allowed = {EXECUTOR / "locks" / "filelock_backend.py"}
    for source in sorted((EXECUTOR / room).rglob("*.py")):
        if source in allowed:
            continue
        text = source.read_text()
        assert not re.search(r"^\s*(import sqlite3|from sqlite3)", text, re.M), source
        assert not re.search(
            r"\b(INSERT INTO|UPDATE \w+ SET|DELETE FROM|SELECT .* FROM)\b", text
        ), source
