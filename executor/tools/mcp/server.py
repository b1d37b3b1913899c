"""One declared MCP server: its processes (one per pool key), started lazily,
restarted with backoff after a crash or a forced stop.

Pooling (`ServerDecl.pool`): DAEMON -- one process for every call; RUN -- one per
run id; AGENT -- one per agent. Per-run and per-agent processes are capped at
`MAX_PROCESSES` per server: the least recently used idle one is closed to make
room (a run's server has no "run ended" signal to wait for yet).

Invariant: `_live[key]` is a connection that was ready when stored; a closed one
is replaced (after its tree is reaped) by the next call that needs it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from execgate.executor.core.errors import ExecgateError, ToolError
from execgate.executor.sandbox import Launch, Sandbox, SandboxError, Serving

from ..decl import Pool, ServerDecl
from ..declguard import masks
from .connection import Connection, StartFailed

# Per-run / per-agent processes of one server kept at once.
MAX_PROCESSES = 8
# Backoff after a failed start or a crash: doubles from the first to the cap.
BACKOFF_FIRST_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0

# Builds the Launch of one process of the server (sandbox chosen, env, workspace bind).
Launcher = Callable[[str], Awaitable[tuple[Sandbox, Launch]]]


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


class Server:
    def __init__(self, decl: ServerDecl, launcher: Launcher) -> None:
        self.decl = decl
        self._launcher = launcher
        self._live: dict[str, Connection] = {}
        self._used: dict[str, float] = {}
        self._busy: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self.restarts = 0
        self.last_error = ""
        self._failures = 0
        self._next_try = 0.0
        self.tool_count = 0

    def key_for(self, run_id: str, agent: str) -> str:
        match self.decl.pool:
            case Pool.DAEMON:
                return ""
            case Pool.RUN:
                return f"run:{run_id}"
            case Pool.AGENT:
                return f"agent:{agent}"

    async def connection(self, key: str, within: float) -> Connection:
        """A ready connection for `key`, started now if there is none (ServerDown if it
        cannot be: backoff, start failure)."""
        async with self._lock:
            conn = self._live.get(key)
            if conn is not None and not conn.closed.is_set():
                self._used[key] = time.monotonic()
                return conn
            if conn is not None:
                await self._forget(key, conn, conn.error or "the server exited")
            return await self._start(key, within)

    async def _start(self, key: str, within: float) -> Connection:
        left = self._next_try - time.monotonic()
        if left > 0:
            raise ServerDown(self.decl.name, self.last_error or "restarting", left)
        await self._make_room()
        try:
            sandbox, launch = await self._launcher(key)
            running = await sandbox.start(launch)
        except (SandboxError, ToolError) as exc:
            raise self._failed(exc.message) from exc
        if not isinstance(running, Serving):
            await running.release()
            raise self._failed(f"{sandbox.name} cannot run a server")
        hidden = masks((c, launch.env[c]) for c, _ in self.decl.env.secrets if c in launch.env)
        conn = Connection(running, self.decl.name, hidden)
        try:
            await conn.wait_ready(min(within, self.decl.startup_timeout))
        except StartFailed as exc:
            raise self._failed(exc.why) from exc
        self._failures = 0
        self._live[key] = conn
        self._used[key] = time.monotonic()
        self.tool_count = len(conn.tools)
        return conn

    def _failed(self, why: str) -> ServerDown:
        self.last_error = why
        self._failures += 1
        backoff = min(BACKOFF_FIRST_SECONDS * 2 ** (self._failures - 1), BACKOFF_MAX_SECONDS)
        self._next_try = time.monotonic() + backoff
        return ServerDown(self.decl.name, why)

    async def _make_room(self) -> None:
        if len(self._live) < MAX_PROCESSES:
            return
        idle = [k for k in self._live if not self._busy.get(k)]
        if idle:
            oldest = min(idle, key=lambda k: self._used.get(k, 0.0))
            conn = self._live.pop(oldest)
            self._used.pop(oldest, None)
            await conn.close()

    async def _forget(self, key: str, conn: Connection, why: str) -> int:
        """Kill what is left of a connection that ended or must end; count a restart."""
        if self._live.get(key) is conn:
            del self._live[key]
            self.restarts += 1
            self.last_error = why
        return await conn.kill()

    async def force_restart(self, conn: Connection, why: str) -> int:
        """Kill the connection's whole tree (a stop that did not end cooperatively); the
        next call starts a new process. Returns how many processes survived."""
        key = next((k for k, c in self._live.items() if c is conn), None)
        if key is None:
            return await conn.kill()
        return await self._forget(key, conn, why)

    def enter(self, key: str) -> None:
        self._busy[key] = self._busy.get(key, 0) + 1

    def leave(self, key: str) -> None:
        self._busy[key] = self._busy.get(key, 1) - 1

    def adopt(self, key: str, conn: Connection) -> None:
        """Keep a connection started elsewhere (discovery at daemon start, `prestart`)."""
        self._live[key] = conn
        self._used[key] = time.monotonic()
        self.tool_count = len(conn.tools)

    async def close(self) -> None:
        live, self._live = self._live, {}
        for conn in live.values():
            await conn.close()

    def status(self) -> ServerStatus:
        running = sum(1 for c in self._live.values() if not c.closed.is_set())
        return ServerStatus(
            self.decl.name, running, self.restarts, self.last_error, self.tool_count
        )


def marker() -> str:
    return secrets.token_hex(8)
