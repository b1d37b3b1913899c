"""Which journal a daemon opens: SQLite in its state directory (the embedded default),
or a PostgreSQL database several daemons share (`--journal postgresql://...`)."""

from __future__ import annotations

import re
from pathlib import Path

from execgate.executor.core.errors import ConfigError

from .base import JournalStore
from .store import Journal

SCHEMES = ("postgresql://", "postgres://")


def is_postgresql(spec: str) -> bool:
    return spec.startswith(SCHEMES)


def open_journal(spec: str, default: Path, *, lease: float = 10.0, name: str = "") -> JournalStore:
    """`spec` "" is SQLite at `default`; a postgresql:// URL is that database, this
    daemon joining it with a lease of `lease` seconds under `name`."""
    if not spec:
        return Journal(default)
    if not is_postgresql(spec):
        raise ConfigError(
            f"--journal {redacted(spec)!r}: give a postgresql://... URL, or leave it out for "
            "the SQLite journal in the state directory"
        )
    try:
        from .pg.store import PgJournal
    except ImportError as exc:  # psycopg is the `postgresql` extra
        raise ConfigError(
            "--journal postgresql://... needs psycopg: pip install 'execgate[postgresql]'"
        ) from exc
    return PgJournal(spec, lease=lease, name=name)


def redacted(spec: str) -> str:
    """The journal's address without a password in it (for logs and messages)."""
    spec = re.sub(r"(://[^/:@]*):[^@/]*@", r"\1:***@", spec)
    return re.sub(r"(password=)[^&\s]*", r"\1***", spec)
