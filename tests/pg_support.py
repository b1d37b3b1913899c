"""A throwaway PostgreSQL server for tests and benchmarks: Debian's server binaries,
a cluster made in a temporary directory, run by an unprivileged user (initdb refuses
root) on a Unix socket in that directory, no TCP; torn down at the end.

`PgServer.database(name)` makes (once) and names a database in it; its `url` is what
`--journal` and `PgJournal` take.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

# Run the server as this user when the tests run as root (initdb refuses root).
SERVER_USER = "postgres"


# Servers started and not yet stopped: stopped when this process exits, so that a run that
# ends early (a timeout, an interrupt) leaves no server behind.
_running: set[PgServer] = set()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_running):
        server.stop()


def bin_dir() -> Path | None:
    """The newest installed server's binaries (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    return Path(found[-1]).parent if found else None


def _version(path: str) -> int:
    part = Path(path).parents[1].name
    return int(part) if part.isdigit() else 0


class PgServer:
    """A cluster in a temporary directory; `start`, `restart`, `stop`."""

    def __init__(self) -> None:
        found = bin_dir()
        if found is None:
            raise RuntimeError(
                "no PostgreSQL server (apt-get install postgresql; .ci/run installs it)"
            )
        self.bin = found
        self.root = Path(tempfile.mkdtemp(prefix="execgate-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root
        self._user = SERVER_USER if os.geteuid() == 0 else None
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o755)  # the daemons (any user) reach the socket through it
        self._databases: set[str] = set()
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8")
        conf = self.data / "postgresql.conf"
        with conf.open("a") as f:
            f.write(
                "listen_addresses = ''\n"
                f"unix_socket_directories = '{self.sockets}'\n"
                "max_connections = 300\n"
                "shared_buffers = 32MB\n"
                # A test cluster must still commit durably: what the journal relies on.
                "fsync = on\n"
            )

    @property
    def admin_url(self) -> str:
        return self.url("postgres")

    def url(self, database: str) -> str:
        return f"postgresql:///{database}?host={self.sockets}&user=postgres"

    def start(self) -> PgServer:
        _running.add(self)
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "start")
        return self

    def restart(self) -> None:
        """Stop (fast: active sessions are ended) and start again."""
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-m",
            "fast",
            "-w",
            "restart",
        )

    def stop(self) -> None:
        _running.discard(self)
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def database(self, name: str) -> str:
        """The url of database `name`, made empty the first time it is asked for."""
        if name not in self._databases:
            self.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self.sql(f'CREATE DATABASE "{name}"')
            self._databases.add(name)
        return self.url(name)

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run one statement with psql; its unaligned output."""
        out = self._run(
            "psql",
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            self.url(database),
            "-c",
            statement,
        )
        return out.strip()

    def log(self) -> str:
        path = self.root / "log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _run(self, program: str, *args: str) -> str:
        cmd = [str(self.bin / program), *args]
        if self._user is not None:
            cmd = [
                "setpriv",
                f"--reuid={self._user}",
                f"--regid={self._user}",
                "--init-groups",
                *cmd,
            ]
        done = subprocess.run(
            cmd, capture_output=True, text=True, cwd=self.root, timeout=120, check=False
        )
        if done.returncode != 0:
            raise subprocess.CalledProcessError(
                done.returncode, cmd, done.stdout, done.stderr + "\n" + self.log()[-2000:]
            )
        return done.stdout


def wait_until(predicate: object, timeout: float, what: str) -> None:
    """Poll `predicate` (a callable) until true, for `timeout` seconds."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.1f}s: {what}")
        time.sleep(0.05)


def journal_rows(
    daemon_root: Path, state_dir: Path, query: str, params: tuple[object, ...] = ()
) -> list[tuple[object, ...]]:
    """Rows of `query` (SQLite's ? placeholders) from the journal of the daemon of
    `daemon_root`, read-only behind the daemon's back: its PostgreSQL database when the
    test runs on one, else `state_dir/journal.db`."""
    from tests.daemon import journal_url

    url = journal_url(daemon_root)
    if url is not None:
        return pg_rows(url, query, params)
    import sqlite3

    conn = sqlite3.connect(f"file:{state_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def pg_rows(url: str, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Rows of `query` (SQLite's ? placeholders) from the PostgreSQL database at `url`."""
    import psycopg

    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(query.replace("?", "%s"), params).fetchall()]


def pg_execute(url: str, statement: str, params: tuple[object, ...] = ()) -> int:
    """Run one statement (SQLite's ? placeholders) and commit; the rows it changed."""
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(statement.replace("?", "%s"), params).rowcount
