"""Whether a server answered a request, seen even after the SDK stopped waiting for it.

A cancelled writer's stop is recorded COOPERATIVE only when its work is known to
have ended (calling.py); the one message that proves it is the server's answer (a
result or an error) to that very request. The SDK cannot tell us: once a request
is abandoned it forgets the id and drops a late answer. So:

- each `tools/call` goes out under an id the daemon chose (`Answers.expect`; the
  expectation reaches `CallDispatcher` in a context variable of the call's task,
  as the SDK's documented `request_id` option), and
- every message the server writes is looked at on its way into the session
  (`_Watched`, the dispatcher's read stream), before the SDK matches it to a waiter.

Both SDKs (Python `mcp`, TypeScript `@modelcontextprotocol/sdk`) never answer a
request once they have received its `notifications/cancelled` (the spec says not
to): an answer after a cancel means the work finished before the cancel reached
the server. A server that ignores the cancel therefore sends nothing, and the
daemon does not take its silence for an end.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from anyio import EndOfStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.dispatcher import CallOptions
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.message import SessionMessage
from mcp.shared.transport_context import TransportContext
from mcp.types import Implementation, JSONRPCError, JSONRPCResponse, RequestId

from .outputs import CheckedSession

# The request whose id the daemon chose, in the task that sends it (set by `calling`).
EXPECTED: ContextVar[Expected | None] = ContextVar("execgate_mcp_expected", default=None)


@dataclass(frozen=True, slots=True)
class Expected:
    """A `tools/call` under the daemon's id; `answered` is set when the server answers it
    (whether or not the SDK still waits for the answer)."""

    id: str
    answered: asyncio.Event


class Answers:
    """One connection's requests whose answer is watched.

    Invariant: an id is in `_waiting` from `expect` until `forget`; ids are never reused
    (a string the SDK never mints: its ids are integers)."""

    def __init__(self) -> None:
        self._waiting: dict[RequestId, asyncio.Event] = {}
        self._next = itertools.count(1)

    def expect(self) -> Expected:
        expected = Expected(f"execgate-{next(self._next)}", asyncio.Event())
        self._waiting[expected.id] = expected.answered
        return expected

    def forget(self, expected: Expected) -> None:
        self._waiting.pop(expected.id, None)

    def saw(self, item: SessionMessage | Exception) -> None:
        if not self._waiting or not isinstance(item, SessionMessage):
            return
        message = item.message
        if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            answered = self._waiting.get(message.id)
            if answered is not None:
                answered.set()

    def session(
        self,
        read: MemoryObjectReceiveStream[SessionMessage | Exception],
        write: MemoryObjectSendStream[SessionMessage],
        client_info: Implementation,
    ) -> CheckedSession:
        """The SDK's session over the streams, its `tools/call` requests watched here
        (and its results checked within bounds: outputs.py)."""
        dispatcher = CallDispatcher(_Watched(read, self), write)
        return CheckedSession(dispatcher=dispatcher, client_info=client_info)


class CallDispatcher(JSONRPCDispatcher[TransportContext]):
    """The SDK's dispatcher; a `tools/call` sent from a task that expects an answer goes
    out under that expectation's id."""

    async def send_raw_request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        opts: CallOptions | None = None,
        *,
        _related_request_id: RequestId | None = None,
    ) -> dict[str, Any]:
        expected = EXPECTED.get()
        if expected is not None and method == "tools/call":
            opts = CallOptions(**(opts or {}), request_id=expected.id)
        return await super().send_raw_request(
            method, params, opts, _related_request_id=_related_request_id
        )


class _Watched:
    """The session's read stream (the SDK's `ReadStream` protocol), each message shown to
    `Answers.saw` first. Runs in the SDK's receive loop: it only looks."""

    def __init__(
        self, inner: MemoryObjectReceiveStream[SessionMessage | Exception], answers: Answers
    ) -> None:
        self._inner = inner
        self._answers = answers

    async def receive(self) -> SessionMessage | Exception:
        item = await self._inner.receive()
        self._answers.saw(item)
        return item

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()
