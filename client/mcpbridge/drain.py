"""The end of stdin is not the end of the answers.

A client may write its requests and close stdin at once (`execgate mcp < requests.jsonl`,
or a pipe closed after the last request). The SDK's server ends its session when the
read stream ends, and a request read just before the end could lose its answer (seen:
a `ping` after `initialize`, one run in six). So the server reads through a relay that,
at the end of stdin, holds the read stream open until every request it passed on has
been answered (a result or an error with its id) -- a request the client cancelled is never
answered (MCP), so it is not waited for -- and at most DRAIN_SECONDS: a client shutting down
(it closes stdin, then waits for the exit) is not held up by a long call, which runs on to its
recorded outcome like any call whose client went away.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
from mcp import types as mcp_types
from mcp.shared.message import SessionMessage

if TYPE_CHECKING:
    from mcp.shared._stream_protocols import ReadStream, WriteStream

__all__ = ["answered_first"]

# The longest the end of stdin waits for answers.
DRAIN_SECONDS = 5.0


class _Unanswered:
    """Request ids passed to the server and not yet answered."""

    def __init__(self) -> None:
        self.ids: set[Any] = set()
        self.none_left = anyio.Event()
        self.none_left.set()

    def asked(self, item: SessionMessage | Exception) -> None:
        if not isinstance(item, SessionMessage):
            return
        message = item.message
        if isinstance(message, mcp_types.JSONRPCRequest):
            self.ids.add(message.id)
            if self.none_left.is_set():
                self.none_left = anyio.Event()
        elif (
            isinstance(message, mcp_types.JSONRPCNotification)
            and message.method == "notifications/cancelled"
            and isinstance(message.params, dict)
        ):
            self._settle(message.params.get("requestId"))

    def _settle(self, request_id: Any) -> None:
        self.ids.discard(request_id)
        if not self.ids:
            self.none_left.set()

    def answered(self, item: SessionMessage) -> None:
        if isinstance(item.message, mcp_types.JSONRPCResponse | mcp_types.JSONRPCError):
            self._settle(item.message.id)


class _Answers:
    """The server's write stream, noting each answer on its way out."""

    def __init__(self, write: WriteStream[SessionMessage], unanswered: _Unanswered) -> None:
        self._write = write
        self._unanswered = unanswered

    async def send(self, item: SessionMessage) -> None:
        await self._write.send(item)
        self._unanswered.answered(item)

    async def aclose(self) -> None:
        await self._write.aclose()

    async def __aenter__(self) -> _Answers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def answered_first(
    read: ReadStream[SessionMessage | Exception], write: WriteStream[SessionMessage]
) -> AsyncIterator[tuple[Any, Any]]:
    """`read` and `write` as the server should get them (module docstring)."""
    unanswered = _Unanswered()
    relay_in, relayed = anyio.create_memory_object_stream[SessionMessage | Exception](0)

    async def relay() -> None:
        async with relay_in:
            async for item in read:
                unanswered.asked(item)
                await relay_in.send(item)
            with anyio.move_on_after(DRAIN_SECONDS):
                await unanswered.none_left.wait()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(relay)
        try:
            yield relayed, _Answers(write, unanswered)
        finally:
            tasks.cancel_scope.cancel()
