"""One MCP server process in its sandbox, and the SDK session over its stdio.

The session's context (the SDK's task group) must be entered and left by one
task, so a `Connection` owns a task that opens the streams, initializes, lists
the tools, then waits until it is stopped, the process exits, or the server's
side of the streams ends (its stdout closed, or a message over `max_line`: the
process may still run, but the session is over). Calls use the session from
their own tasks.

Invariants: `session` is set exactly while `ready` is set and `closed` is not;
once `closed` is set the process has exited or is being killed (a session that
ended on its own starts the kill itself), and every call still waiting on the
session fails with the SDK's "connection closed". One kill per connection:
every `kill()` awaits the same one and gets its survivors' count.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping

import mcp.types as mcp_types
from mcp import ClientSession

from execgate.executor.core.errors import ExecgateError
from execgate.executor.sandbox import Serving
from execgate.executor.sandbox.ladder import REAP_SECONDS

from ..declguard import cut
from .answers import Answers
from .transport import MAX_LINE_BYTES, Broken, open_streams

CLIENT_INFO = mcp_types.Implementation(name="execgate", version="1")
# How long a closing connection gives the server to exit once its stdin is closed.
CLOSE_GRACE_SECONDS = 1.0
# Characters of a server's stderr quoted in a start failure.
STDERR_IN_ERRORS = 1000
# What a server's tools/list may come to, over all its pages: a server that lists on
# and on fails to start instead of filling the daemon's memory (and ListTools' reply).
MAX_TOOLS = 1024
MAX_LISTING_BYTES = 8 << 20


class StartFailed(ExecgateError):
    """The server did not come up: `why` (exited, timed out, protocol error)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class ListingTooLong(ExecgateError):
    """The server's tools/list went past MAX_TOOLS tools or MAX_LISTING_BYTES."""


class Connection:
    def __init__(
        self,
        running: Serving,
        name: str,
        hidden: Mapping[str, str] | None = None,
        *,
        max_line: int = MAX_LINE_BYTES,
        on_closed: Callable[[Connection], None] | None = None,
    ) -> None:
        self.running = running
        self.name = name
        # Each form of the server's secrets -> its name: cut from all it writes.
        self._hidden = hidden or {}
        self.session: ClientSession | None = None
        self.tools: list[mcp_types.Tool] = []
        self.ready = asyncio.Event()
        self.closed = asyncio.Event()
        # time.monotonic() when it became ready (0: not yet).
        self.ready_at = 0.0
        # Why the connection ended ("" while it has not, or when the daemon ended it).
        self.error = ""
        # The calls' requests whose answer is watched (answers.py).
        self.answers = Answers()
        # What the server wrote on stderr (its first `output_cap` bytes), once killed.
        self.stderr = ""
        self._max_line = max_line
        # Called once `closed` is set, whatever closed it.
        self._on_closed = on_closed
        # Set by close() and kill(): the end is the daemon's, not the server's.
        self._stop = asyncio.Event()
        # The server's side of the streams ended (stdout closed, a line too long).
        self._ended = asyncio.Event()
        # The one kill of the process tree (None: not begun); its result: survivors.
        self._kill: asyncio.Task[int] | None = None
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
                open_streams(
                    stdin,
                    stdout,
                    max_line=self._max_line,
                    on_end=self._stream_ended,
                    hidden=self._hidden,
                ) as (read, write),
                self.answers.session(read, write, CLIENT_INFO) as session,
            ):
                await session.initialize()
                self.tools = await _list_all(session)
                session.know(self.tools)
                self.session = session
                self.ready_at = time.monotonic()
                self.ready.set()
                stop = asyncio.ensure_future(self._stop.wait())
                ended = asyncio.ensure_future(self._ended.wait())
                await asyncio.wait({stop, ended, exited}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                ended.cancel()
                if self._ended.is_set() and not self.error:
                    # stdout closed: the process is most likely exiting; say how it did.
                    await asyncio.wait({exited}, timeout=CLOSE_GRACE_SECONDS)
                if exited.done():
                    why = f": {self.error}" if self.error else ""
                    self.error = f"server exited ({_exit_text(exited.result())}){why}"
                elif self._ended.is_set() and not self._stop.is_set():
                    self.error = self.error or "the server closed its stdout"
        except Exception as exc:  # the SDK's errors, grouped by its task groups
            self.error = self.error or _describe(exc)
            if exited.done():
                self.error = f"server exited ({_exit_text(exited.result())}): {self.error}"
        finally:
            self.session = None
            exited.cancel()
            if not self._stop.is_set():  # the server ended it: kill what is left of it
                self._begin_kill()
            self.closed.set()
            if self._on_closed is not None:
                self._on_closed(self)

    def _stream_ended(self, why: Broken | None) -> None:
        """The transport's `on_end`: the session cannot go on, whatever the process does."""
        if why is not None:
            self.error = str(why)
        self._ended.set()

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
        Every caller awaits the same kill (a caller cancelled meanwhile does not stop
        it) and gets its survivors' count."""
        return await asyncio.shield(self._begin_kill())

    def _begin_kill(self) -> asyncio.Task[int]:
        self._stop.set()
        if self._kill is None:
            self._kill = asyncio.ensure_future(self._kill_tree())
        return self._kill

    async def _kill_tree(self) -> int:
        await self.running.kill()
        left = await reap(self.running)
        self._task.cancel()  # a no-op once the session has ended on its own
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        _, err = await self.running.output()
        text = err.data.decode("utf-8", errors="replace")
        self.stderr = cut(text, self._hidden, truncated=err.truncated).strip()
        await self.running.release()
        return len(left)


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
    """Every page of the server's tools; ListingTooLong past the bounds."""
    tools: list[mcp_types.Tool] = []
    size = 0
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        size += sum(len(t.model_dump_json(by_alias=True)) for t in page.tools)
        if len(tools) > MAX_TOOLS:
            raise ListingTooLong(f"the server listed more than {MAX_TOOLS} tools")
        if size > MAX_LISTING_BYTES:
            raise ListingTooLong(
                f"the server's tools came to more than {MAX_LISTING_BYTES >> 20} MiB"
            )
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
