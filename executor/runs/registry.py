"""Runs: the daemon's record of each agent loop (see proto/execgate/v1/runs.proto).

The client moves its state machine; the daemon keeps the moves, in order, and
refuses any that would corrupt the record. Appended events are checked with the
transition table every loop is generated from (proto/execgate/v1/runstates.json,
read through `core.runstate`), so a client in any language cannot write a history
the Python loop could not replay. A run's row and its events change in one transaction.

Refusals are typed (`RunRefused.kind`): not_found, exists, forbidden, gap,
duplicate, discontinuous, illegal, ended, malformed. A terminal run refuses
further events, and the dispatcher refuses its tool calls (`ended`). `on_ended`
hears of each run reaching a terminal state (set by the daemon's wiring: what a
run kept, an MCP server's `pool: run` process, is let go).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import enum
import json
import secrets
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace

from execgate.executor.core import clock
from execgate.executor.core.errors import ExecgateError
from execgate.executor.core.fanout import Closed, Fanout, Lagging
from execgate.executor.core.requests import MAX_ID_CHARS, SHARED_RUN
from execgate.executor.core.run import CancelAsk, Run
from execgate.executor.core.runstate import TERMINAL, BrokenHistory, History, State, Transition
from execgate.executor.journal.base import RunRecordStore

from .steps import IN_BATCH
from .syncs import Durability, Syncs

MAX_DATA_BYTES = 1 << 20
MAX_GOAL_BYTES = 64 * 1024
# Runs whose state machine stays in memory between appends (least recently
# appended dropped first; replayed from the journal when next needed).
MAX_MACHINES = 4096


class Refusal(enum.StrEnum):
    NOT_FOUND = "not_found"
    EXISTS = "exists"
    FORBIDDEN = "forbidden"
    MALFORMED = "malformed"
    ENDED = "ended"
    # Someone asked the run to stop: it may end, but not as `completed`.
    CANCEL_REQUESTED = "cancel_requested"
    # Breakage kinds of a history that does not fit (core.runstate.Breakage).
    GAP = "gap"
    DUPLICATE = "duplicate"
    DISCONTINUOUS = "discontinuous"
    ILLEGAL = "illegal"


class Closing(ExecgateError):
    """The daemon is stopping: a WatchRun stream of `run_id` ends before its run did."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"the daemon is stopping; run {run_id!r} is still open")
        self.run_id = run_id


class RunRefused(ExecgateError):
    def __init__(self, kind: Refusal, message: str, field: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.field = field


# Decides a step's moves from the run's state and next seq (runs/steps.py).
Compose = Callable[[State, int], list[Transition]]


@dataclass(frozen=True, slots=True)
class StepMoves:
    """What `step_move` found and recorded."""

    # The run as it now is.
    run: Run
    # The step's moves recorded after the handler's `seen`, in order: another
    # handler's, then its own.
    events: tuple[Transition, ...]
    # The step has ended (its last move left the batch's states).
    ended: bool


@dataclass(frozen=True, slots=True)
class Update:
    """What a WatchRun stream carries: a new event, or a cancel request."""

    event: Transition | None = None
    cancel: CancelAsk | None = None


class RunStore:
    def __init__(self, records: RunRecordStore, *, shared: bool = False) -> None:
        self.records = records
        # Other daemons append to the same journal (PostgreSQL): what is kept in memory
        # (machines, owners) is checked against the journal's run row before it is used.
        self.shared = shared
        # run id -> terminal state, for the dispatcher (no tool call of an ended run).
        self.ended: dict[str, str] = records.ended()
        # run id -> owner, for the dispatcher: only the owner's calls join a started run.
        self.owners: dict[str, str] = records.owners()
        # run id -> its workspace, for the dispatcher: a started run's calls work there.
        self.workspaces: dict[str, str] = records.workspaces()
        # Told the run id of each run that reaches a terminal state, once it is recorded.
        self.on_ended: Callable[[str], None] = _nobody
        # The state machines of runs appended to lately (replayed from the journal
        # when missing): at most MAX_MACHINES, least recently used dropped first.
        self._machines: OrderedDict[str, History] = OrderedDict()
        # Invariant: a run id is here exactly while a WatchRun stream of it is served.
        self._watchers: dict[str, Fanout[Update]] = {}
        # Invariant: a run id is here exactly while an append or cancel of it holds or
        # waits for its lock.
        self._locks: dict[str, _RunLock] = {}
        # The background fsyncs of Durability.SOON writes (a step's end).
        self.syncs = Syncs(records.sync)
        # Of the runs watched here: the last seq published to their streams, and those
        # whose cancel request was (kept while watched: `watch` drops them).
        self._heard: dict[str, int] = {}
        self._cancel_told: set[str] = set()

    async def start(self, run: Run) -> Run:
        _check_text(run.goal, MAX_GOAL_BYTES, "goal")
        now = clock.now()
        run = replace(
            run,
            run_id=run.run_id or "run_" + secrets.token_hex(8),
            created_at=now,
            updated_at=now,
            state=State.CREATED.value,
        )
        _check_id(run.run_id)

        # A run id other identities have used is theirs too: starting it would let
        # one agent claim (and then cancel) another's calls (the store checks that).
        conflict = await self.records.insert(run)
        if conflict is not None and conflict.others:
            why = f"run {run.run_id!r} already has calls by {', '.join(conflict.others)}"
            raise RunRefused(Refusal.FORBIDDEN, why, "run_id")
        if conflict is not None:
            raise RunRefused(Refusal.EXISTS, f"run {run.run_id!r} exists already", "run_id")
        self.owners[run.run_id] = run.owner
        self.workspaces[run.run_id] = run.workspace
        return run

    async def get(self, run_id: str) -> Run:
        found = await self.records.get(run_id)
        if found is None:
            raise RunRefused(Refusal.NOT_FOUND, f"no run {run_id!r}", "run_id")
        return found

    async def events(self, run_id: str, after_seq: int = 0) -> list[Transition]:
        return await self.records.events(run_id, after_seq)

    async def find(
        self, states: Iterable[str], owner: str, limit: int, owners: tuple[str, ...] | None = None
    ) -> list[Run]:
        wanted = list(states)
        if "active" in wanted:  # every state a run can still leave
            wanted = [s for s in wanted if s != "active"] + [
                s.value for s in State if s not in TERMINAL
            ]
        return await self.records.find(wanted, owner, max(1, min(limit or 100, 1000)), owners)

    async def append(self, run_id: str, events: list[Transition], who: str) -> Run:
        """Check `events` against the run's history and store all of them, or none."""
        async with self._lock(run_id):
            run = await self.get(run_id)
            if who != run.owner:
                raise RunRefused(Refusal.FORBIDDEN, f"run {run_id!r} belongs to {run.owner}")
            if run.terminal:
                raise RunRefused(Refusal.ENDED, f"run {run_id!r} ended ({run.state})", "events")
            if run.cancel is not None and any(e.to_state is State.COMPLETED for e in events):
                raise RunRefused(
                    Refusal.CANCEL_REQUESTED,
                    f"run {run_id!r}: {run.cancel.requester} asked it to stop; it cannot "
                    "complete (end it cancelled)",
                    "events",
                )
            updated = await self._store(run_id, events, Durability.NOW, run.last_seq)
        self._appended(run_id, events)
        return updated

    async def open_step(self, run_id: str, events: list[Transition], who: str) -> Run:
        """A loop step's opening (Runs.Step): check `events` as `append` does and store
        them, committed before the batch is sent -- or, when they are recorded already
        exactly so (a retried step), store nothing. The last one must enter
        running_tools: the batch follows.

        Not fsync'd of its own (Durability.FOLLOWING): everything that depends on the
        opening comes after it in the journal's commit order -- the intents of the
        batch's writing calls (fsync'd before they start) and the step's end -- and a
        durable write makes every write committed before it durable too (journal/base).
        No effect is ever on disk without the transition that sent it."""
        if not events or events[-1].to_state is not State.RUNNING_TOOLS:
            why = "events: a step's transitions end by entering running_tools"
            raise RunRefused(Refusal.MALFORMED, why, "events")
        async with self._lock(run_id):
            owner, last_seq = await self._owner(run_id)
            if who != owner:
                raise RunRefused(Refusal.FORBIDDEN, f"run {run_id!r} belongs to {owner}")
            machine = await self._machine(run_id, last_seq)
            if machine.state in TERMINAL:
                why = f"run {run_id!r} ended ({machine.state.value})"
                raise RunRefused(Refusal.ENDED, why, "events")
            if events[0].seq < machine.next_seq and await self._recorded(run_id, events):
                return await self.get(run_id)
            opened = await self._store(run_id, events, Durability.FOLLOWING, last_seq)
        self._appended(run_id, events)
        return opened

    async def step_move(
        self, run_id: str, seen: int, compose: Compose, durability: Durability
    ) -> StepMoves:
        """Record the daemon's own moves of an open step, decided by `compose` from the
        state the run is in now (runs/steps.py); `seen` is the last seq this step's
        handler knows of. Moves recorded since by another handler of the same step (a
        client's retry racing the original) are taken as they are; once a move has
        ended the step (left running_tools and awaiting_approval), nothing more is
        recorded for it -- a step never ends twice."""
        async with self._lock(run_id):
            last_seq = (await self.get(run_id)).last_seq if self.shared else None
            machine = await self._machine(run_id, last_seq)
            others = await self.events(run_id, seen) if machine.next_seq - 1 > seen else []
            for i, moved in enumerate(others):
                if moved.to_state not in IN_BATCH:
                    return StepMoves(await self.get(run_id), tuple(others[: i + 1]), ended=True)
            moves = compose(machine.state, machine.next_seq)
            if not moves:
                return StepMoves(await self.get(run_id), tuple(others), ended=False)
            updated = await self._store(run_id, moves, durability, last_seq)
        self._appended(run_id, moves)
        ended = moves[-1].to_state not in IN_BATCH
        return StepMoves(updated, (*others, *moves), ended=ended)

    async def _recorded(self, run_id: str, events: list[Transition]) -> bool:
        """Whether `events` are in the run's history as they are (the time aside): a
        retried step's opening. False lets the history check refuse them (duplicate)."""
        stored = (await self.events(run_id, events[0].seq - 1))[: len(events)]
        return len(stored) == len(events) and all(
            (s.seq, s.from_state, s.to_state, s.reason, s.data)
            == (e.seq, e.from_state, e.to_state, e.reason, e.data)
            for s, e in zip(stored, events, strict=True)
        )

    async def _owner(self, run_id: str) -> tuple[str, int | None]:
        """The run's owner, and its last seq when the journal is shared (None: the
        machine kept here is exact). Alone on its journal the owner comes from memory
        (`owners`, kept by start): no read on the way."""
        if self.shared:
            run = await self.get(run_id)
            self.owners.setdefault(run_id, run.owner)
            # A run started on another daemon whose notice has not arrived yet: the
            # step's batch still works in the run's workspace.
            self.workspaces.setdefault(run_id, run.workspace)
            return run.owner, run.last_seq
        owner = self.owners.get(run_id)
        if owner is None:
            raise RunRefused(Refusal.NOT_FOUND, f"no run {run_id!r}", "run_id")
        return owner, None

    async def _store(
        self,
        run_id: str,
        events: list[Transition],
        durability: Durability,
        last_seq: int | None,
    ) -> Run:
        """Check `events` against the run's machine (at `last_seq`, the journal's, when
        known), append them, keep the machine moved. Under the run's lock."""
        machine = copy.copy(await self._machine(run_id, last_seq))
        for moved in events:
            _check_text(json.dumps(moved.data), MAX_DATA_BYTES, "events.data_json")
            try:
                machine.record(moved)
            except BrokenHistory as exc:
                raise RunRefused(Refusal(exc.kind.value), str(exc), "events") from None
        durable = durability is Durability.NOW
        try:  # another daemon sharing the journal may have appended the same seq
            updated = await self.records.append(run_id, events, durable=durable)
        except BrokenHistory as exc:
            self._machines.pop(run_id, None)
            raise RunRefused(Refusal(exc.kind.value), str(exc), "events") from None
        self._keep(run_id, machine)
        if run_id in self._watchers:
            self._heard[run_id] = max(self._heard.get(run_id, 0), updated.last_seq)
        if durability is Durability.SOON:
            self.syncs.start(run_id)
        return updated

    async def drain(self) -> None:
        """Wait for every fsync started in the background (at shutdown)."""
        await self.syncs.drain()

    def _appended(self, run_id: str, events: list[Transition]) -> None:
        """Tell who listens: the dispatcher and `on_ended` of an end, watchers of each move."""
        if events and events[-1].to_state in TERMINAL:
            self.ended[run_id] = events[-1].to_state.value
            self.on_ended(run_id)
        for moved in events:
            self._publish(run_id, Update(event=moved))

    async def request_cancel(self, run_id: str, ask: CancelAsk) -> Run:
        """Record who asked the run to stop (the first request stands). Under the run's
        lock: an append checks for a cancel and writes in one step, so a run cannot
        complete past a recorded cancel."""
        async with self._lock(run_id):
            run = await self.get(run_id)
            if run.cancel is None and not run.terminal:
                run = await self.records.request_cancel(run_id, ask)
                if run_id in self._watchers:
                    self._cancel_told.add(run_id)
                self._publish(run_id, Update(cancel=ask))
        return run

    async def watch(self, run_id: str, after_seq: int) -> AsyncGenerator[Update, None]:
        """The run's events after `after_seq`, then new ones, until its terminal event
        has been sent. Raises `Closing` if the daemon stops first, and fanout.Lagging
        if the stream's client falls MAX_BACKLOG updates behind."""
        fanout = self._watchers.setdefault(run_id, Fanout())
        watcher = fanout.subscribe()
        sent = after_seq
        try:
            run = await self.get(run_id)
            self._heard.setdefault(run_id, run.last_seq)
            if run.cancel is not None:
                self._cancel_told.add(run_id)
            for moved in await self.events(run_id, after_seq):
                sent = moved.seq
                yield Update(event=moved)
                if moved.to_state in TERMINAL:
                    return
            if run.terminal:  # its end was at or before after_seq
                return
            if run.cancel is not None:
                yield Update(cancel=run.cancel)
            while True:
                try:
                    update = await watcher.get()
                except Closed:
                    raise Closing(run_id) from None
                if update.event is not None and update.event.seq <= sent:
                    continue  # read from the table already
                yield update
                if update.event is not None:
                    sent = update.event.seq
                    if update.event.to_state in TERMINAL:
                        return
        except Lagging as exc:
            raise Lagging(exc.backlog, f"resume with after_seq={sent}") from None
        finally:
            fanout.unsubscribe(watcher)
            if not fanout:
                del self._watchers[run_id]
                self._heard.pop(run_id, None)
                self._cancel_told.discard(run_id)

    async def heard(self, run_id: str) -> None:
        """Another daemon sharing the journal started, appended to or was asked to stop
        `run_id`: the run rules here follow, and the WatchRun streams here get what is new."""
        run = await self.records.get(run_id)
        if run is None:
            return
        self.owners.setdefault(run_id, run.owner)
        self.workspaces.setdefault(run_id, run.workspace)
        if run.terminal and run_id not in self.ended:
            self.ended[run_id] = run.state
            self._machines.pop(run_id, None)
            self.on_ended(run_id)
        if run_id not in self._watchers:
            return
        for moved in await self.events(run_id, self._heard.get(run_id, 0)):
            self._publish(run_id, Update(event=moved))
            self._heard[run_id] = moved.seq
        if run.cancel is not None and run_id not in self._cancel_told:
            self._cancel_told.add(run_id)
            self._publish(run_id, Update(cancel=run.cancel))

    async def reread(self) -> None:
        """Notices may have been missed: look again at every run watched here."""
        for run_id in list(self._watchers):
            await self.heard(run_id)

    def close(self) -> None:
        for fanout in self._watchers.values():
            fanout.close("the daemon is stopping")

    async def _machine(self, run_id: str, last_seq: int | None) -> History:
        """The run's machine at `last_seq` (the journal's, when known): replayed unless
        the one kept is there (another daemon sharing the journal may have appended
        since). None: the one kept is exact (every append goes through this store)."""
        found = self._machines.get(run_id)
        stale = last_seq is not None and found is not None and found.next_seq != last_seq + 1
        if found is None or stale:
            found = History.replay(run_id, await self.events(run_id))
        return found

    def _keep(self, run_id: str, machine: History) -> None:
        """Remember `run_id`'s machine (an ended run's is never needed again)."""
        if machine.state in TERMINAL:
            self._machines.pop(run_id, None)
            return
        self._machines[run_id] = machine
        self._machines.move_to_end(run_id)
        while len(self._machines) > MAX_MACHINES:
            self._machines.popitem(last=False)

    @contextlib.asynccontextmanager
    async def _lock(self, run_id: str) -> AsyncIterator[None]:
        """One append or cancel of `run_id` at a time; the lock lives while used. Taken,
        it first waits for the fsync of the run's last write told Durability.SOON."""
        held = self._locks.get(run_id)
        if held is None:
            held = self._locks[run_id] = _RunLock()
        held.users += 1
        try:
            async with held.lock:
                # Nothing more of a run is recorded before its last write is on disk.
                await self.syncs.settled(run_id)
                yield
        finally:
            held.users -= 1
            if not held.users:
                del self._locks[run_id]

    def _publish(self, run_id: str, update: Update) -> None:
        fanout = self._watchers.get(run_id)
        if fanout is not None:
            fanout.publish(update)


def _nobody(_run_id: str) -> None:
    pass


@dataclass(slots=True)
class _RunLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Appends and cancels holding or awaiting `lock`.
    users: int = 0


def _check_id(run_id: str) -> None:
    if run_id == SHARED_RUN:
        why = "the shared implicit run belongs to no agent; start a run with its own id"
        raise RunRefused(Refusal.FORBIDDEN, why, "run_id")
    if len(run_id) > MAX_ID_CHARS:
        raise RunRefused(Refusal.MALFORMED, f"run_id: over {MAX_ID_CHARS} characters", "run_id")


def _check_text(text: str, cap: int, field_name: str) -> None:
    if len(text.encode()) > cap:
        raise RunRefused(Refusal.MALFORMED, f"{field_name}: more than {cap} bytes", field_name)
