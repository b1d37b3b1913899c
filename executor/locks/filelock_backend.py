"""Locks shared by several daemons on one host that serve the same workspace.

The lock table lives in a small SQLite database in a private lock directory;
every read-decide-write step holds a `filelock.FileLock` mutex, so the daemons
apply the same grant rule (`decide`) to one table, one step at a time:

    <lock_dir>/              0700
        table.db             entries: ticket, instance, owner, plan, granted, flow, cap, tag
        table.lock           the mutex
        instances/<id>.lock  flock held by each live daemon instance

Waiters stand in the fair order of `decide.Turns` (the `tag` column, then the
ticket); a flow is one agent of one daemon instance, so each daemon's policy caps
its own agents' calls and an agent served by two daemons is two flows.

A waiting call polls (backoff 5 ms to 50 ms; a release in the same daemon wakes
it at once). Crash safety: a daemon holds an flock on its instance file for its
lifetime and the kernel drops it when the process dies, however it dies. Before
every decision, entries of instances whose file can be locked by someone else
are purged, so a SIGKILLed daemon never blocks the one restarted after it.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import filelock

from .base import Abandoned, BackendClosed, Lease, LockEntry, LockError, Snapshot, WaitInfo
from .decide import Ask, Entries, LockTable, decide, entries, wait_info
from .keys import Key
from .modes import LockMode

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    ticket   INTEGER PRIMARY KEY AUTOINCREMENT,  -- FIFO order; never reused
    instance TEXT NOT NULL,                      -- the daemon instance that asked
    owner    TEXT NOT NULL,
    plan     TEXT NOT NULL,                      -- JSON [[key parts, mode], ...]
    granted  INTEGER NOT NULL DEFAULT 0,         -- 1 from the grant until release
    flow     TEXT NOT NULL DEFAULT '',           -- whose turn: the agent (decide.Turns)
    cap      INTEGER NOT NULL DEFAULT 0,         -- grants the flow may hold (0: no cap)
    tag      INTEGER NOT NULL DEFAULT 0          -- fair order: (tag, ticket)
)
"""
# Columns a table made before fair order lacks (added in place: a lock directory is
# shared by every daemon of the workspace; an older daemon's entries get tag 0 and
# so stand first).
_ADDED = (
    ("flow", "TEXT NOT NULL DEFAULT ''"),
    ("cap", "INTEGER NOT NULL DEFAULT 0"),
    ("tag", "INTEGER NOT NULL DEFAULT 0"),
)
_INSTANCE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")

# ticket, instance, owner, plan, granted, flow, cap
Row = tuple[int, str, str, str, int, str, int]


class FileLockManager:
    """The same `acquire`/`Lease` API as `LockManager`, across processes.

    Use one instance per daemon, from its event loop's thread. Every step is a
    short blocking transaction (about 0.2 ms), taken on the event loop.
    """

    def __init__(
        self,
        lock_dir: str | os.PathLike[str],
        *,
        instance_id: str | None = None,
        poll: tuple[float, float] = (0.005, 0.05),
        mutex_timeout: float = 10.0,
    ) -> None:
        """Join (or create) the lock table in `lock_dir` as a new daemon instance.

        Args:
            lock_dir: shared by every daemon serving the workspace; created 0700.
            instance_id: this daemon's name in the table (default: random). Reusing
                the id of a dead instance drops whatever it left behind.
            poll: first and longest wait between two looks at the table, seconds.
            mutex_timeout: how long one step may wait for the table's mutex.
        """
        self.instance_id = instance_id or uuid.uuid4().hex
        if not _INSTANCE_ID.fullmatch(self.instance_id):
            raise ValueError(f"bad instance id {self.instance_id!r}")
        self._dir = Path(lock_dir)
        self._instances = self._dir / "instances"
        self._poll_min, self._poll_max = poll
        self._mutex_timeout = mutex_timeout
        for d in (self._dir, self._instances):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._mutex = filelock.FileLock(
            self._dir / "table.lock", thread_local=False, poll_interval=0.001
        )
        self._db = sqlite3.connect(self._dir / "table.db", isolation_level=None)
        # Invariant: -1 once closed; otherwise an fd holding LOCK_EX on our instance file.
        self._instance_fd = -1
        # Leases granted to this instance and not yet released, with their tickets.
        self._leases: dict[Lease, int] = {}
        # Parsed plans by ticket (tickets are never reused), pruned at every decision.
        self._plans: dict[int, Entries] = {}
        # Resolved when something changes here, so local waiters look at once.
        self._kick: asyncio.Future[None] | None = None
        try:
            self._open()
        except BaseException:
            self._db.close()
            raise

    # -- the public surface ---------------------------------------------------------

    async def acquire(
        self,
        owner: str,
        plan: Mapping[Key, LockMode],
        *,
        cancel: asyncio.Event | None = None,
        on_wait: Callable[[WaitInfo], None] | None = None,
        flow: str = "",
        cap: int = 0,
    ) -> Lease:
        """Wait until every lock of `plan` is granted to `owner`, all at once; `flow`
        and `cap` as for `LockManager.acquire` (the cap counts this daemon's grants).

        Raises:
            Abandoned: `cancel` was set before the grant; the entry is gone.
            BackendClosed: this manager was closed.
            LockError: the table's mutex could not be taken in time.
        """
        self._check_open()
        if cancel is not None and cancel.is_set():
            raise Abandoned(owner)
        ask = Ask(entries(plan), flow, cap)
        ticket, granted, info = self._enqueue(owner, ask, on_wait is not None)
        try:
            if not granted:
                if on_wait is not None and info is not None:
                    on_wait(info)
                await self._poll(ticket, owner, cancel)
        except BaseException:
            self._remove(ticket)  # waiting or granted just now: either way, gone
            raise
        lease = Lease(owner, plan, self._release)
        self._leases[lease] = ticket
        return lease

    def snapshot(self) -> Snapshot:
        """Every live daemon's holders and waiters, each in fair order (tag, ticket)."""
        self._check_open()
        with self._step():
            self._purge_dead()
            rows = self._rows()
        shown = [
            LockEntry(owner, tuple((Key(k), m) for k, m in self._plan(t, p)), bool(g), inst, f, c)
            for t, inst, owner, p, g, f, c in rows
        ]
        return Snapshot(
            tuple(e for e in shown if e.granted), tuple(e for e in shown if not e.granted)
        )

    def close(self) -> None:
        """Leave the table: drop this instance's entries, free its instance lock.

        Waiters of this instance fail with BackendClosed; leases become no-ops.
        """
        if self._instance_fd < 0:
            return
        try:
            with self._step():
                self._db.execute("DELETE FROM entries WHERE instance = ?", (self.instance_id,))
        finally:
            self._leases.clear()
            (self._instances / f"{self.instance_id}.lock").unlink(missing_ok=True)
            os.close(self._instance_fd)
            self._instance_fd = -1
            self._db.close()
            self._wake()

    def __enter__(self) -> FileLockManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- steps on the table ----------------------------------------------------------

    def _open(self) -> None:
        """Claim the instance file and set up the table (under the mutex)."""
        with self._step(begin=False):
            self._db.execute("PRAGMA journal_mode=WAL")
            # Locks mean nothing after a reboot: no need to fsync every step.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            have = {row[1] for row in self._db.execute("PRAGMA table_info(entries)")}
            for name, decl in _ADDED:
                if name not in have:
                    self._db.execute(f"ALTER TABLE entries ADD COLUMN {name} {decl}")
            self._instance_fd = _claim(self._instances / f"{self.instance_id}.lock")
            self._db.execute("DELETE FROM entries WHERE instance = ?", (self.instance_id,))
            for path in self._instances.glob("*.lock"):
                if path.stem != self.instance_id:
                    _dead(path)  # unlinks files of dead instances that left no entries

    @contextmanager
    def _step(self, *, begin: bool = True) -> Iterator[None]:
        """One transaction on the table, holding the mutex every daemon takes."""
        try:
            self._mutex.acquire(timeout=self._mutex_timeout)
        except filelock.Timeout as exc:
            raise LockError(f"lock table mutex busy for {self._mutex_timeout}s") from exc
        try:
            if not begin:
                yield
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        finally:
            self._mutex.release()

    def _enqueue(self, owner: str, ask: Ask, want_info: bool) -> tuple[int, bool, WaitInfo | None]:
        """Append an entry and decide; returns its ticket, whether granted, why not."""
        text = json.dumps([[parts, mode.name] for parts, mode in ask.items])
        with self._step():
            tag = self._next_tag(ask.flow)
            cur = self._db.execute(
                "INSERT INTO entries (instance, owner, plan, flow, cap, tag) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (self.instance_id, owner, text, ask.flow, ask.cap, tag),
            )
            ticket = cur.lastrowid
            assert ticket is not None
            self._plans[ticket] = ask.items
            rows = self._decide()
        mine = next(r for r in rows if r[0] == ticket)
        if mine[4] or not want_info:
            return ticket, bool(mine[4]), None
        holders = [(r[2], self._plan(r[0], r[3])) for r in rows if r[4]]
        waiting = [r for r in rows if not r[4]]
        earlier = [(r[2], self._plan(r[0], r[3])) for r in waiting[: waiting.index(mine)]]
        info = wait_info(ask.items, holders, earlier)
        mine_running = sum(1 for r in rows if r[4] and self._flow_key(r) == self._flow_key(mine))
        if ask.cap and mine_running >= ask.cap:
            info = WaitInfo(info.keys, info.blockers, capped=ask.cap)
        return ticket, False, info

    def _next_tag(self, flow: str) -> int:
        """decide.Turns over the table: one more than the flow's last waiting tag, and
        than the smallest waiting tag."""
        smallest, last = self._db.execute(
            "SELECT MIN(tag), MAX(CASE WHEN instance = ? AND flow = ? THEN tag END) "
            "FROM entries WHERE granted = 0",
            (self.instance_id, flow),
        ).fetchone()
        return max(last or 0, smallest or 0) + 1

    async def _poll(self, ticket: int, owner: str, cancel: asyncio.Event | None) -> None:
        """Look at the table with backoff until the entry is granted or `cancel` fires."""
        delay = self._poll_min
        gave_up = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
        try:
            while True:
                watched: list[asyncio.Future[Any]] = [self._kick_future()]
                if gave_up is not None:
                    watched.append(gave_up)
                await asyncio.wait(watched, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
                if gave_up is not None and gave_up.done():
                    raise Abandoned(owner)
                if self._granted(ticket):
                    return
                delay = min(delay * 2, self._poll_max)
        finally:
            if gave_up is not None:
                gave_up.cancel()

    def _granted(self, ticket: int) -> bool:
        self._check_open()
        with self._step():
            rows = self._decide()
        for t, _, _, _, g, _, _ in rows:
            if t == ticket:
                return bool(g)
        raise LockError(f"lock entry {ticket} vanished from the table")

    def _decide(self) -> list[Row]:
        """Purge dead instances, grant what the rule admits; returns the table after."""
        self._purge_dead()
        rows = self._rows()
        held = LockTable(self._plan(r[0], r[3]) for r in rows if r[4])
        running: dict[str, int] = {}
        for r in rows:
            if r[4]:
                running[self._flow_key(r)] = running.get(self._flow_key(r), 0) + 1
        queue = [
            (r[0], Ask(self._plan(r[0], r[3]), self._flow_key(r), r[6])) for r in rows if not r[4]
        ]
        granted = set(decide(held, running, queue))
        if granted:
            self._db.executemany(
                "UPDATE entries SET granted = 1 WHERE ticket = ?", [(t,) for t in granted]
            )
            self._wake()
        live = {r[0] for r in rows}
        self._plans = {t: p for t, p in self._plans.items() if t in live}
        return [(*r[:4], 1 if r[0] in granted else r[4], *r[5:]) for r in rows]

    @staticmethod
    def _flow_key(row: Row) -> str:
        """A flow is one agent of one daemon instance (instance ids hold no NUL)."""
        return f"{row[1]}\0{row[5]}"

    def _purge_dead(self) -> None:
        others = self._db.execute(
            "SELECT DISTINCT instance FROM entries WHERE instance != ?", (self.instance_id,)
        ).fetchall()
        for (instance,) in others:
            if _INSTANCE_ID.fullmatch(instance) is None or _dead(
                self._instances / f"{instance}.lock"
            ):
                self._db.execute("DELETE FROM entries WHERE instance = ?", (instance,))

    def _rows(self) -> list[Row]:
        """Holders and waiters, in fair order (decide.Turns)."""
        return self._db.execute(
            "SELECT ticket, instance, owner, plan, granted, flow, cap FROM entries "
            "ORDER BY tag, ticket"
        ).fetchall()

    def _plan(self, ticket: int, text: str) -> Entries:
        items = self._plans.get(ticket)
        if items is None:
            items = tuple((tuple(parts), LockMode[mode]) for parts, mode in json.loads(text))
            self._plans[ticket] = items
        return items

    def _release(self, lease: Lease) -> None:
        ticket = self._leases.pop(lease, None)
        if ticket is not None:
            self._remove(ticket)

    def _remove(self, ticket: int) -> None:
        if self._instance_fd < 0:
            return  # closed: close() dropped every entry of ours
        with self._step():
            self._db.execute("DELETE FROM entries WHERE ticket = ?", (ticket,))
        self._wake()

    # -- small helpers ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._instance_fd < 0:
            raise BackendClosed("the file lock manager is closed")

    def _kick_future(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        kick = self._kick
        if kick is None or kick.done() or kick.get_loop() is not loop:
            kick = self._kick = loop.create_future()
        return kick

    def _wake(self) -> None:
        """Let this daemon's waiters look at the table now instead of after their backoff."""
        kick, self._kick = self._kick, None
        if kick is not None and not kick.done():
            kick.set_result(None)


def _claim(path: Path) -> int:
    """Open and flock the instance file; refuse an id a live daemon still holds."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise LockError(f"lock instance {path.stem!r} is in use by a live daemon") from exc
    return fd


def _dead(path: Path) -> bool:
    """True (and the file removed) if no live process holds the instance file's flock.

    Called under the table mutex, and instance files are claimed under it too,
    so nobody can be between creating the file and locking it.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)
