"""Locks shared by daemons on several hosts, through the PostgreSQL journal's database.

The same grant rule as the in-process and filelock backends (`decide`: all or
nothing, intention modes, fair order per conflict, per-agent caps), applied to a
lock table in PostgreSQL (journal/pg/locktable.py holds its SQL; docs/architecture.md
has the design):

- every change -- a new waiter, a release, a waiter giving up -- is one transaction
  inside the lock space's critical section (a transaction-level advisory lock) that
  also runs the grant pass and NOTIFYs the space on commit;
- a waiting daemon is woken by that notification (LISTEN on its presence session),
  which names the tickets granted: it resolves its own at once, with no query; it
  never polls. A reap (which frees entries without a pass) notifies `*`: a daemon with
  waiters then runs one grant pass of its own for all of them.
  As a fallback for a notification lost to a broken session it re-reads when the
  session is back (RESYNC) and, should even that miss one, every `reread` seconds
  while it has waiters;
- a flow is one agent of one daemon (as with filelock): each daemon's policy caps its
  own calls;
- liveness is the journal's: a daemon that died is reaped (presence.py) within about
  its lease, its entries deleted and the space notified; a daemon that lost its lease
  fails its waiters, and its calls can no longer record an intent (fenced).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from execgate.executor.journal.base import JournalStore
from execgate.executor.journal.pg.locktable import Pass, PgLockTable, Row, told
from execgate.executor.journal.pg.presence import LOCKS_CHANNEL
from execgate.executor.journal.pg.store import PgJournal

from .base import Abandoned, BackendClosed, Lease, LockEntry, LockError, Snapshot, WaitInfo
from .decide import Ask, Entries, LockTable, decide, entries, wait_info
from .keys import Key
from .manager import _granted_or_cancelled
from .modes import LockMode

log = logging.getLogger("execgate.locks")


@dataclass(slots=True)
class _Waiter:
    # Resolved on the daemon's loop: the grant (None) or why there is none.
    future: asyncio.Future[None]
    # Passes started before it waited cannot know it: only a later one may call it gone.
    since: int


class PgLockManager:
    """The `LockBackend` of `--locks postgresql`, for one daemon, one lock space.

    Use it from the daemon's event loop; the table's steps run on the journal's loop.
    """

    def __init__(self, journal: JournalStore, space: str, *, reread: float = 5.0) -> None:
        if not isinstance(journal, PgJournal):
            raise LockError("--locks postgresql needs the journal on PostgreSQL (--journal)")
        self._db = journal.db
        self._me = journal.presence.daemon_id
        self._table = PgLockTable(journal.db, self._me, space)
        self._reread = reread
        self._loop: asyncio.AbstractEventLoop | None = None
        # Invariant: a ticket is here while its acquire waits for it (this daemon's).
        self._waiters: dict[int, _Waiter] = {}
        self._leases: dict[Lease, int] = {}
        # Parsed plans by ticket (tickets are never reused); only the journal's loop
        # touches it (the rule runs there), pruned at every pass.
        self._plans: dict[int, Entries] = {}
        # Grant passes started for waiters (the daemon's loop), one at a time.
        self._passes = 0
        self._passing = False
        self._again = False
        # Notifications seen (a waiter that enqueued meanwhile asks for a pass).
        self._gen = 0
        self._closed = False
        self._unsubscribe = journal.presence.subscribe(LOCKS_CHANNEL, self._notified)
        journal.presence.on_lost.append(self._lost)
        self._rereading = self._db.submit(self._rereads())
        # Entries enter the table in the order this daemon's calls asked (a batch's
        # conflicting calls in proposal order): one enqueue at a time, in arrival order
        # (asyncio.Lock is FIFO). Concurrent enqueues took pool connections and the table's
        # critical section in any order (tests/integration/test_pg_locks.py's random
        # schedules: "c6 overtook earlier conflicting c4"); the critical section
        # serializes them anyway, so little is lost.
        self._enqueuing = asyncio.Lock()

    # -- the public surface ---------------------------------------------------------------

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
            LockError: the entry vanished (this daemon lost its lease).
        """
        self._check_open()
        if cancel is not None and cancel.is_set():
            raise Abandoned(owner)
        self._loop = asyncio.get_running_loop()
        ask = Ask(entries(plan), flow, cap)
        text = json.dumps([[parts, mode.name] for parts, mode in ask.items])
        gen = self._gen
        ticket, done = await self._enqueue(owner, text, ask)
        if ticket not in done.granted:
            if on_wait is not None:
                info = self._why(done.rows, ticket, ask)
                told: Callable[[], None] = lambda: on_wait(info)  # noqa: E731
            else:
                told = _nothing
            await self._wait(ticket, owner, gen, cancel, told)
        return self._lease(owner, plan, ticket)

    async def _wait(
        self,
        ticket: int,
        owner: str,
        gen: int,
        cancel: asyncio.Event | None,
        told: Callable[[], None],
    ) -> None:
        """Until the entry is granted; gone from the table if it never is."""
        assert self._loop is not None
        waiter = _Waiter(self._loop.create_future(), self._passes)
        self._waiters[ticket] = waiter
        try:
            told()
            if self._gen != gen:  # notified while enqueuing: that news could not name us
                self._kick()
            await _granted_or_cancelled(waiter.future, cancel)
            if not waiter.future.done():
                raise Abandoned(owner)
            waiter.future.result()
        except BaseException:
            self._remove_soon(ticket)  # waiting, or granted just now: either way, gone
            raise
        finally:
            self._waiters.pop(ticket, None)

    def snapshot(self) -> Snapshot:
        """Every live daemon's holders and waiters in the space, in fair order (blocking)."""
        self._check_open()
        rows = self._db.call(self._table.rows())
        shown = [
            LockEntry(
                r.owner,
                tuple((Key(k), m) for k, m in _parse(r.plan)),
                r.granted,
                str(r.daemon),
                r.flow,
                r.cap,
            )
            for r in rows
        ]
        return Snapshot(
            tuple(e for e in shown if e.granted), tuple(e for e in shown if not e.granted)
        )

    def close(self) -> None:
        """Leave the space: drop this daemon's entries; waiters fail with BackendClosed."""
        if self._closed:
            return
        self._closed = True
        self._unsubscribe()
        self._rereading.cancel()
        self._leases.clear()
        self._fail_all(BackendClosed("the postgresql lock manager is closed"))
        try:
            self._db.call(self._table.leave())
        except Exception as exc:  # the server is away: reaping frees them with the lease
            log.warning("locks: could not leave the lock table: %s", exc)

    # -- steps on the table ---------------------------------------------------------------

    async def _enqueue(self, owner: str, text: str, ask: Ask) -> tuple[int, Pass]:
        """Add the entry; a cancellation meanwhile never leaves it behind."""
        async with self._enqueuing:
            step = self._db.submit(self._table.enqueue(owner, text, ask.flow, ask.cap, self._rule))
            try:
                return await asyncio.shield(asyncio.wrap_future(step))
            except asyncio.CancelledError:
                step.add_done_callback(self._drop_late)
                raise

    def _drop_late(self, step: concurrent.futures.Future[tuple[int, Pass]]) -> None:
        if not step.cancelled() and step.exception() is None:
            self._remove_soon(step.result()[0])

    def _rule(self, rows: list[Row]) -> set[int]:
        """`decide` over the space's rows (on the journal's loop, in the transaction)."""
        live = {r.ticket for r in rows}
        self._plans = {t: p for t, p in self._plans.items() if t in live}
        held = LockTable(self._plan(r) for r in rows if r.granted)
        running: dict[str, int] = {}
        for r in rows:
            if r.granted:
                running[_flow(r)] = running.get(_flow(r), 0) + 1
        queue = [(r.ticket, Ask(self._plan(r), _flow(r), r.cap)) for r in rows if not r.granted]
        return set(decide(held, running, queue))

    def _plan(self, row: Row) -> Entries:
        items = self._plans.get(row.ticket)
        if items is None:
            items = self._plans[row.ticket] = _parse(row.plan)
        return items

    def _why(self, rows: list[Row], ticket: int, ask: Ask) -> WaitInfo:
        """What the new waiter `ticket` waits for, from the table its enqueue saw."""
        mine = next(i for i, r in enumerate(rows) if r.ticket == ticket)
        holders = [(r.owner, _parse(r.plan)) for r in rows if r.granted]
        earlier = [(r.owner, _parse(r.plan)) for r in rows[:mine] if not r.granted]
        info = wait_info(ask.items, holders, earlier)
        key = f"{self._me}\0{ask.flow}"
        held = sum(1 for r in rows if r.granted and _flow(r) == key)
        if ask.cap and held >= ask.cap:
            return WaitInfo(info.keys, info.blockers, capped=ask.cap)
        return info

    def _lease(self, owner: str, plan: Mapping[Key, LockMode], ticket: int) -> Lease:
        lease = Lease(owner, plan, self._release)
        self._leases[lease] = ticket
        return lease

    def _release(self, lease: Lease) -> None:
        ticket = self._leases.pop(lease, None)
        if ticket is not None and not self._closed:
            self._remove_soon(ticket)

    def _remove_soon(self, ticket: int) -> None:
        """Delete the entry without waiting; the pass it runs may grant our waiters."""
        if self._closed:
            return
        step = self._db.submit(self._table.remove(ticket, self._rule))
        self._after(step, self._passes)

    # -- waking the waiters -------------------------------------------------------------------

    def _notified(self, payload: str | None) -> None:
        """A notification on the locks channel (on the journal's loop): the tickets a
        change granted (no query needed), or a reap or a resync (a pass of our own)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if payload is None or payload == "*":
            loop.call_soon_threadsafe(self._kick)
            return
        granted = told(payload, self._table.space)
        if granted:
            loop.call_soon_threadsafe(self._granted, granted)

    def _granted(self, tickets: frozenset[int]) -> None:
        """Another daemon's change granted these tickets (on the daemon's loop)."""
        self._gen += 1
        for ticket in tickets:
            waiter = self._waiters.get(ticket)
            if waiter is not None and not waiter.future.done():
                waiter.future.set_result(None)

    def _kick(self) -> None:
        """Run a grant pass for our waiters (one at a time; another after it if asked)."""
        self._gen += 1
        if self._closed or not self._waiters:
            return
        if self._passing:
            self._again = True
            return
        self._passing = True
        self._passes += 1
        step = self._db.submit(self._table.grant_pass(self._rule))
        self._after(step, self._passes, passing=True)

    def _after(
        self, step: concurrent.futures.Future[Pass], started: int, *, passing: bool = False
    ) -> None:
        loop = self._loop
        if loop is None:
            return

        def done(_: object) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._apply, step, started, passing)

        step.add_done_callback(done)

    def _apply(self, step: concurrent.futures.Future[Pass], started: int, passing: bool) -> None:
        """Resolve the waiters a pass granted (or found gone); on the daemon's loop."""
        if passing:
            self._passing = False
        error = None if step.cancelled() else step.exception()
        if error is not None:
            log.warning("locks: a lock table step failed: %s", error)
            self._again = True  # look again: the next notification or re-read
        elif not step.cancelled():
            rows = {r.ticket: r for r in step.result().rows}
            for ticket, waiter in list(self._waiters.items()):
                row = rows.get(ticket)
                if waiter.future.done():
                    continue
                if row is not None and row.granted:
                    waiter.future.set_result(None)
                elif row is None and waiter.since < started:
                    waiter.future.set_exception(
                        LockError("the lock entry vanished: this daemon lost its lease")
                    )
        if passing and self._again:
            self._again = False
            self._kick()

    async def _rereads(self) -> None:
        """The fallback (on the journal's loop): a pass every `reread` s while waiting."""
        while True:
            await asyncio.sleep(self._reread)
            loop = self._loop
            if self._waiters and loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._kick)

    def _lost(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(
                self._fail_all, LockError("this daemon lost its lease in the shared database")
            )

    def _fail_all(self, error: LockError) -> None:
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(error)

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosed("the postgresql lock manager is closed")


def _nothing() -> None:
    pass


def _flow(row: Row) -> str:
    """A flow is one agent of one daemon."""
    return f"{row.daemon}\0{row.flow}"


def _parse(text: str) -> Entries:
    return tuple((tuple(parts), LockMode[mode]) for parts, mode in json.loads(text))
