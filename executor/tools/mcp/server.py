"""One declared MCP server: its processes (one per pool key), started lazily,
restarted with backoff after a failed start or a crash.

A pool key is who shares the process (`ServerDecl.pool`: DAEMON -- every call;
RUN -- one per run id; AGENT -- one per agent), where it runs (`Placement`:
the backend and confinement the policy gives the calls) and the workspace it
serves (its cwd and its only bind: a process sees one workspace). Agents whose
sandbox rules differ never share a process, even under DAEMON, nor do calls in
different workspaces.

Starts belong to the server, not to a caller: each is a task it owns, bounded by
the server's `startup_timeout` alone. Callers wait for it with their own deadline;
one that gives up (deadline, cancel) leaves the start running for the next call,
and a cancelled caller cannot leave a process nobody owns. Keys are independent:
one key's start never holds up another key's calls.

Backoff: a failed start and a crash (a live process that ended on its own) count
as failures; after `n` failures in a row the next start waits 0.5 s * 2^(n-1),
at most 30 s. Failures further apart than STABLE_SECONDS are not a loop: the count
starts over. A call whose deadline ends before the backoff does fails now
(ServerDown, "next try in"); the others wait for it.

Invariants: `_slots[key].conn` is a connection that was ready when stored and is
cleared (synchronously, when it closes) before anything else sees it closed; a slot
has a connection, a start, or a call using it -- else it is removed. At most
MAX_PROCESSES slots hold a connection or a start: the least recently used idle
one is closed to make room, and a start with none to close is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from execgate.executor.core.errors import ExecgateError, ToolError
from execgate.executor.core.paths import Workspace
from execgate.executor.sandbox import Confinement, Launch, Sandbox, SandboxError, Serving

from ..decl import Pool, ServerDecl
from ..declguard import masks
from .connection import Connection, StartFailed

log = logging.getLogger("execgate.mcp")

# Processes of one server kept at once (every pool key and placement).
MAX_PROCESSES = 8
# Backoff after a failed start or a crash: doubles from the first to the cap.
BACKOFF_FIRST_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
# Failures further apart than this start the backoff over.
STABLE_SECONDS = 60.0
# Ended runs remembered: a call admitted before its run ended may start its process after.
ENDED_RUNS_KEPT = 1024


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a process of the server runs: the backend and the confinement."""

    sandbox: Sandbox
    confinement: Confinement


@dataclass(frozen=True, slots=True)
class PoolKey:
    share: str  # who shares the process: "" (every call), "run:ID", "agent:NAME"
    placement: Placement
    # The workspace the process works in: keys are equal when their roots are (two
    # objects or names for one directory share a process).
    workspace: Workspace = field(compare=False)
    root: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", self.workspace.lock_root)


# The Launch of one process of the server at `placement` in a workspace (env, bind).
Launcher = Callable[[Placement, Workspace], Launch]
# (tool name, agent) -> where the policy in force puts that agent's calls of the tool.
Placer = Callable[[str, str], Placement]


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """What `execgate doctor` shows for one server."""

    name: str
    running: int  # live processes
    restarts: int
    last_error: str
    tools: int


class ServerDown(ExecgateError):
    """The server cannot be started now: `why`; `retry_in` seconds of backoff left."""

    def __init__(self, name: str, why: str, retry_in: float = 0.0) -> None:
        wait = f" (next try in {retry_in:.1f}s)" if retry_in > 0 else ""
        super().__init__(f"MCP server {name}: {why}{wait}")
        self.name = name
        self.why = why
        self.retry_in = retry_in


class _Slot:
    """One pool key's process: starting, live, or in use by calls."""

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.starting: asyncio.Task[Connection] | None = None
        self.used = time.monotonic()
        self.busy = 0  # calls using `conn` now
        self.retired = False  # closed as soon as no call uses it
        # (tool, agent) pairs that used it: whether it still fits them after a reload.
        self.users: set[tuple[str, str]] = set()


class Server:
    def __init__(self, decl: ServerDecl, launcher: Launcher, place: Placer) -> None:
        self.decl = decl
        self._launcher = launcher
        self.place = place
        self._slots: dict[PoolKey, _Slot] = {}
        # Connections of starts not yet ready: close() kills them.
        self._pending: set[Connection] = set()
        # Closes and reaps it began and has not seen end (close() awaits them).
        self._chores: set[asyncio.Future[Any]] = set()
        self._closing = asyncio.Event()
        self._ended_runs: OrderedDict[str, None] = OrderedDict()
        self.restarts = 0
        self.last_error = ""
        self._failures = 0
        self._last_failure = 0.0
        self._next_try = 0.0
        self.tool_count = 0

    def key_for(
        self, run_id: str, agent: str, placement: Placement, workspace: Workspace
    ) -> PoolKey:
        match self.decl.pool:
            case Pool.DAEMON:
                return PoolKey("", placement, workspace)
            case Pool.RUN:
                return PoolKey(f"run:{run_id}", placement, workspace)
            case Pool.AGENT:
                return PoolKey(f"agent:{agent}", placement, workspace)

    @contextlib.asynccontextmanager
    async def use(
        self,
        key: PoolKey,
        within: float | None,
        gave_up: asyncio.Event | None = None,
        user: tuple[str, str] = ("", ""),
    ) -> AsyncIterator[Connection | None]:
        """A ready connection for `key` while the block runs, started if there is none;
        None if the caller's `within` seconds end (or `gave_up` is set) while it starts
        (None: the caller waits as long as the start takes). `user` (tool, agent) is
        remembered for `reconfine`. ServerDown if it cannot be started (backoff beyond
        the deadline, a failed start)."""
        deadline = None if within is None else time.monotonic() + within
        conn = await self._acquire(key, deadline, gave_up)
        if conn is None:
            yield None
            return
        slot = self._slots[key]
        slot.users.add(user)
        try:
            yield conn
        finally:
            self._release(key)

    async def _acquire(
        self, key: PoolKey, deadline: float | None, gave_up: asyncio.Event | None
    ) -> Connection | None:
        while True:
            slot = self._slots.get(key)
            conn = slot.conn if slot is not None else None
            if slot is not None and conn is not None and not conn.closed.is_set():
                slot.busy += 1
                slot.used = time.monotonic()
                return conn
            task = slot.starting if slot is not None else None
            if task is None:
                task = self._begin(key, deadline)
            if not await _wait(task, deadline, gave_up):
                return None
            task.result()  # its ServerDown; else the next turn finds the connection

    def _begin(self, key: PoolKey, deadline: float | None) -> asyncio.Task[Connection]:
        now = time.monotonic()
        backoff = max(self._next_try - now, 0.0)
        if backoff > 0 and deadline is not None and now + backoff >= deadline:
            raise ServerDown(self.decl.name, self.last_error or "restarting", backoff)
        self._make_room()
        slot = self._slots.setdefault(key, _Slot())
        slot.retired = key.share in self._ended_runs
        task = asyncio.ensure_future(self._start(key, slot, backoff))
        task.add_done_callback(_retrieved)  # every waiter may have given up on it
        slot.starting = task
        return task

    async def _start(self, key: PoolKey, slot: _Slot, backoff: float) -> Connection:
        try:
            if backoff > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), backoff)
            if self._closing.is_set():
                raise ServerDown(self.decl.name, "closing")
            conn = await self._spawn(key)
            slot.conn = conn
            slot.used = time.monotonic()
            self.tool_count = len(conn.tools)
            return conn
        finally:
            slot.starting = None
            self._drop_if_unused(key, slot)

    async def _spawn(self, key: PoolKey) -> Connection:
        """Start one process and wait until it is ready (startup_timeout); a failure is
        counted (backoff) and nothing of the process is left."""
        sandbox = key.placement.sandbox
        try:
            launch = self._launcher(key.placement, key.workspace)
            running = await sandbox.start(launch)
        except (SandboxError, ToolError) as exc:
            raise self._failed(exc.message) from exc
        if not isinstance(running, Serving):
            await running.kill()
            await running.release()
            raise self._failed(f"{sandbox.name} cannot run a server")
        hidden = masks((c, launch.env[c]) for c, _ in self.decl.env.secrets if c in launch.env)
        on_closed = functools.partial(self._closed, key)
        conn = Connection(
            running,
            self.decl.name,
            hidden,
            max_line=self.decl.max_message_bytes,
            on_closed=on_closed,
        )
        self._pending.add(conn)
        try:
            if self._closing.is_set():
                await conn.kill()
                raise ServerDown(self.decl.name, "closing")
            await conn.wait_ready(self.decl.startup_timeout)
        except StartFailed as exc:
            if self._closing.is_set():
                raise ServerDown(self.decl.name, "closing") from exc
            raise self._failed(exc.why) from exc
        finally:
            self._pending.discard(conn)
        return conn

    def _failed(self, why: str) -> ServerDown:
        self.last_error = why
        self._back_off()
        return ServerDown(self.decl.name, why)

    def _back_off(self) -> None:
        now = time.monotonic()
        if now - self._last_failure > STABLE_SECONDS:
            self._failures = 0
        self._failures += 1
        self._last_failure = now
        backoff = BACKOFF_FIRST_SECONDS * 2 ** min(self._failures - 1, 16)
        self._next_try = now + min(backoff, BACKOFF_MAX_SECONDS)

    def _closed(self, key: PoolKey, conn: Connection) -> None:
        """A connection closed (its `on_closed`). If it was still live, the server ended
        it (a crash, a line too long): count a restart and a failure, reap the tree."""
        slot = self._slots.get(key)
        if slot is None or slot.conn is not conn:
            return  # the daemon closed it, or it never served
        slot.conn = None
        self.restarts += 1
        self.last_error = conn.error or "the server exited"
        self._back_off()
        self._chore(conn.kill())
        self._drop_if_unused(key, slot)

    def _make_room(self) -> None:
        held = {k: s for k, s in self._slots.items() if s.conn is not None or s.starting}
        if len(held) < MAX_PROCESSES:
            return
        idle = [k for k, s in held.items() if not s.busy and s.starting is None]
        if not idle:
            raise ServerDown(self.decl.name, f"its {MAX_PROCESSES} processes are all in use")
        self._retire(min(idle, key=lambda k: held[k].used))

    def _retire(self, key: PoolKey) -> None:
        """Close the key's process now, or once the calls using it (or its start) end."""
        slot = self._slots.get(key)
        if slot is None:
            return
        if slot.busy or slot.starting is not None:
            slot.retired = True
            return
        del self._slots[key]
        if slot.conn is not None:
            self._chore(slot.conn.close())

    def _release(self, key: PoolKey) -> None:
        slot = self._slots.get(key)
        if slot is None:
            return
        slot.busy -= 1
        slot.used = time.monotonic()
        if slot.retired and not slot.busy:
            self._retire(key)
        else:
            self._drop_if_unused(key, slot)

    def _drop_if_unused(self, key: PoolKey, slot: _Slot) -> None:
        unused = slot.conn is None and slot.starting is None and not slot.busy
        if unused and self._slots.get(key) is slot:
            del self._slots[key]

    def _chore(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._chores.add(task)
        task.add_done_callback(self._chore_done)

    def _chore_done(self, task: asyncio.Future[Any]) -> None:
        self._chores.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning(
                "MCP server %s: closing a process failed: %s", self.decl.name, task.exception()
            )

    async def force_restart(self, conn: Connection, why: str) -> int:
        """Kill the connection's whole tree (a stop that did not end cooperatively); the
        next call starts a new process. Returns how many processes survived."""
        for key, slot in list(self._slots.items()):
            if slot.conn is conn:
                slot.conn = None
                self.restarts += 1
                self.last_error = why
                self._drop_if_unused(key, slot)
        self._chore(conn.kill())  # close() waits for it, should this caller be cancelled
        return await conn.kill()

    def run_ended(self, run_id: str) -> None:
        """The run reached a terminal state: its processes (`pool: run`) are closed now,
        or when its last call ends."""
        if self.decl.pool is not Pool.RUN:
            return
        share = f"run:{run_id}"
        self._ended_runs[share] = None
        while len(self._ended_runs) > ENDED_RUNS_KEPT:
            self._ended_runs.popitem(last=False)
        for key in [k for k in self._slots if k.share == share]:
            self._retire(key)

    def reconfine(self) -> None:
        """After a reload: close each process that no caller it served would be given
        now (their sandbox rule changed); their next calls start one that fits."""
        for key, slot in list(self._slots.items()):
            if slot.conn is None or not slot.users:
                continue
            if not any(self._placed(tool, agent) == key.placement for tool, agent in slot.users):
                self._retire(key)

    def _placed(self, tool: str, agent: str) -> Placement | None:
        try:
            return self.place(tool, agent)
        except SandboxError:
            return None

    async def close(self) -> None:
        """Kill every process and every start in progress; the server may start anew."""
        self._closing.set()
        try:
            for conn in list(self._pending):
                self._chore(conn.kill())
            starts = [s.starting for s in self._slots.values() if s.starting is not None]
            await asyncio.gather(*starts, return_exceptions=True)
            slots, self._slots = self._slots, {}
            for slot in slots.values():
                if slot.conn is not None:
                    self._chore(slot.conn.close())
            while self._chores:
                await asyncio.gather(*self._chores, return_exceptions=True)
        finally:
            self._closing.clear()

    def status(self) -> ServerStatus:
        running = sum(
            1 for s in self._slots.values() if s.conn is not None and not s.conn.closed.is_set()
        )
        return ServerStatus(
            self.decl.name, running, self.restarts, self.last_error, self.tool_count
        )


async def _wait(
    task: asyncio.Task[Connection], deadline: float | None, gave_up: asyncio.Event | None
) -> bool:
    """Whether `task` is done before `deadline` and before `gave_up` is set. The task is
    never cancelled: a caller that stops waiting leaves it to the server."""
    if task.done():
        return True
    asked = asyncio.ensure_future(gave_up.wait()) if gave_up is not None else None
    try:
        waits: set[asyncio.Future[Any]] = {task} if asked is None else {task, asked}
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if asked is not None:
            asked.cancel()
    return task.done()


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A start's failure is its waiters' (ServerDown); with none left, nobody's."""
    if not task.cancelled():
        task.exception()
