"""One MCP server process in its sandbox, and the SDK session over its stdio.

The session's context (the SDK's task group) must be entered and left by one
task, so a `Connection` owns a task that opens the streams, initializes, lists
the tools, then waits until it is stopped or the process exits. Calls use the
session from their own tasks.

Invariants: `session` is set exactly while `ready` is set and `closed` is not;
once `closed` is set the process has exited or is being killed, and every call
still waiting on the session fails with the SDK's "connection closed".
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import mcp.types as mcp_types
from mcp import ClientSession

from execgate.executor.core.errors import ExecgateError
from execgate.executor.sandbox import Serving
from execgate.executor.sandbox.ladder import REAP_SECONDS

from .answers import Answers
from .transport import open_streams

CLIENT_INFO = mcp_types.Implementation(name="execgate", version="1")
# How long a closing connection gives the server to exit once its stdin is closed.
CLOSE_GRACE_SECONDS = 1.0
# Characters of a server's stderr quoted in a start failure.
STDERR_IN_ERRORS = 1000


class StartFailed(ExecgateError):
    """The server did not come up: `why` (exited, timed out, protocol error)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Connection:
    def __init__(self, running: Serving, name: str) -> None:
        self.running = running
        self.name = name
        self.session: ClientSession | None = None
        self.tools: list[mcp_types.Tool] = []
        self.ready = asyncio.Event()
        self.closed = asyncio.Event()
        self.error = ""
        # The calls' requests whose answer is watched (answers.py).
        self.answers = Answers()
        # What the server wrote on stderr (its first `output_cap` bytes), once killed.
        self.stderr = ""
        self._stop = asyncio.Event()
        # Survivors of the kill, once killed (None: not killed yet).
        self._killed: int | None = None
        self._task = asyncio.ensure_future(self._run())

    async def wait_ready(self, within: float) -> None:
        """Until initialized and listed; StartFailed (the process killed) otherwise."""
        up = asyncio.ensure_future(self.ready.wait())
        down = asyncio.ensure_future(self.closed.wait())
        try:
            await asyncio.wait({up, down}, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
            down.cancel()
        if self.ready.is_set() and not self.closed.is_set():
            return
        why = self.error or f"not ready within {within:g}s"
        await self.kill()
        if self.stderr:
            why += f"; stderr: {self.stderr[-STDERR_IN_ERRORS:]}"
        raise StartFailed(why)

    async def _run(self) -> None:
        stdin, stdout = self.running.stdio()
        exited = asyncio.ensure_future(self.running.wait())
        try:
            async with (
                open_streams(stdin, stdout) as (read, write),
                self.answers.session(read, write, CLIENT_INFO) as session,
            ):
                await session.initialize()
                self.tools = await _list_all(session)
                self.session = session
                self.ready.set()
                stop = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait({stop, exited}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if exited.done():
                    self.error = f"server exited ({_exit_text(exited.result())})"
        except Exception as exc:  # the SDK's errors, grouped by its task groups
            self.error = self.error or _describe(exc)
            if exited.done():
                self.error = f"server exited ({_exit_text(exited.result())}): {self.error}"
        finally:
            self.session = None
            self.closed.set()
            exited.cancel()

    async def ping(self, within: float) -> bool:
        """Whether the server answers a ping within `timeout` (it is reading its stdin)."""
        session = self.session
        if session is None or within <= 0:
            return False
        try:
            await asyncio.wait_for(session.send_ping(), within)
        except Exception:
            return False
        return True

    async def close(self) -> None:
        """End the session (the server's stdin closes), give it a moment, then kill."""
        self._stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.running.wait(), CLOSE_GRACE_SECONDS)
        await self.kill()

    async def kill(self) -> int:
        """Force-terminate the server's whole tree and release it; what survived.
        Idempotent: a second kill reports the first one's survivors."""
        self._stop.set()
        if self._killed is not None:
            return self._killed
        await self.running.kill()
        left = await reap(self.running)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        _, err = await self.running.output()
        self.stderr = err.data.decode("utf-8", errors="replace").strip()
        await self.running.release()
        self._killed = len(left)
        return self._killed


async def reap(running: Serving) -> list[int]:
    """Wait until no process of the server is left (killing again what forked meanwhile)."""
    deadline = time.monotonic() + REAP_SECONDS
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(running.wait(), REAP_SECONDS)
    while True:
        left = await running.survivors()
        if not left or time.monotonic() >= deadline:
            return left
        await running.kill()
        await asyncio.sleep(0.01)


async def _list_all(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def _exit_text(ended: object) -> str:
    code = getattr(ended, "code", None)
    sig = getattr(ended, "signal", None)
    return f"killed by signal {sig}" if sig is not None else f"status {code}"
