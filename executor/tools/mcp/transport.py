"""The SDK's message streams over a sandboxed server's stdin and stdout.

`mcp.client.stdio.stdio_client` spawns the server itself, which would bypass the
sandbox; this is the same newline-delimited JSON-RPC framing over streams the
sandbox gives us (`Serving.stdio`). Reading is bounded: a line longer than
`max_line` ends the read stream, so a server that floods stdout without a newline
cannot make the daemon hold it all. So are the server's own requests: the SDK
answers each in a task of its own, which holds the request until its answer is
written -- to a server that may never read its stdin. More than
MAX_SERVER_REQUESTS unanswered at once, or more than `max_line` bytes of them, end
the read stream too (`TooManyRequests`). `on_end` tells the owner of the streams
that the server's side ended (its stdout closed, a line too long, too many
requests): the session is over whether or not the process still runs
(connection.py then kills it).

The server's secrets (`env.secrets`) are cut here, from every message it writes,
before the SDK sees it: results, structuredContent, errors, progress, tool lists --
whatever a message holds reaches the journal, the logs and the client only as
`[secret NAME]` (declguard.cut_json; the raw and JSON-escaped forms of each value).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping

import anyio
import mcp.types as mcp_types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from mcp.types import RequestId

from execgate.executor.core.errors import ExecgateError

from ..decl import MAX_MESSAGE_BYTES
from ..declguard import cut, cut_json

log = logging.getLogger("execgate.mcp")

# Bytes of one JSON-RPC message from a server; more ends the session (the tools
# file's `max_message_kb` sets it per server).
MAX_LINE_BYTES = MAX_MESSAGE_BYTES
# A server's requests to the daemon not answered yet; more ends the session.
MAX_SERVER_REQUESTS = 16

Streams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]


class LineTooLong(ExecgateError):
    """The server wrote more than `limit` bytes without a newline."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a message from the server exceeded {limit} bytes")
        self.limit = limit


class TooManyRequests(ExecgateError):
    """The server's requests the daemon had not answered went past `limit` (or past
    the bytes of one message): it is not reading its stdin, or floods."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the server sent more than {limit} requests (or one message's bytes of them) "
            "that the daemon could not answer yet (is it reading its stdin?)"
        )
        self.limit = limit


# Why the server's side of the streams ended before its stdout closed.
Broken = LineTooLong | TooManyRequests
# Called once when the server's side of the streams ends: with what ended it, or None
# when its stdout closed.
OnEnd = Callable[[Broken | None], None]


class _Owed:
    """The server's requests not answered yet: their ids and sizes (the reader adds,
    the writer's answers and the server's own cancels remove)."""

    def __init__(self, max_bytes: int) -> None:
        self._sizes: dict[RequestId, int] = {}
        self._max_bytes = max_bytes

    def asked(self, item: SessionMessage | Exception, size: int) -> TooManyRequests | None:
        """Note a message from the server; what ends the session, if it is too much."""
        match item.message if isinstance(item, SessionMessage) else None:
            case mcp_types.JSONRPCRequest(id=request_id):
                self._sizes[request_id] = size
                too_many = len(self._sizes) > MAX_SERVER_REQUESTS
                if too_many or sum(self._sizes.values()) > self._max_bytes:
                    return TooManyRequests(MAX_SERVER_REQUESTS)
            case mcp_types.JSONRPCNotification(method="notifications/cancelled", params=params):
                answered = (params or {}).get("requestId")
                if isinstance(answered, int | str):
                    self._sizes.pop(answered, None)
        return None

    def answered(self, message: mcp_types.JSONRPCMessage) -> None:
        match message:
            case (
                mcp_types.JSONRPCResponse(id=request_id) | mcp_types.JSONRPCError(id=request_id)
            ) if request_id is not None:
                self._sizes.pop(request_id, None)


@contextlib.asynccontextmanager
async def open_streams(
    stdin: asyncio.StreamWriter,
    stdout: asyncio.StreamReader,
    *,
    max_line: int = MAX_LINE_BYTES,
    on_end: OnEnd | None = None,
    hidden: Mapping[str, str] | None = None,
) -> AsyncIterator[Streams]:
    """(read stream, write stream) for `mcp.ClientSession`, until the block exits.

    The read stream ends when the server's stdout closes (it exited or was killed):
    every request still waiting then fails with the SDK's "connection closed".
    `hidden`: each form of a secret's value -> its name, cut from every message.
    """
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    owed = _Owed(max_line)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_reader, stdout, to_session, max_line, on_end or _ignore, hidden or {}, owed)
        tg.start_soon(_writer, stdin, from_session, owed)
        try:
            yield read_stream, write_stream
        finally:
            tg.cancel_scope.cancel()
            with contextlib.suppress(Exception):
                stdin.close()
            for stream in (read_stream, write_stream):
                await stream.aclose()


async def _reader(
    stdout: asyncio.StreamReader,
    sink: MemoryObjectSendStream[SessionMessage | Exception],
    max_line: int,
    on_end: OnEnd,
    hidden: Mapping[str, str],
    owed: _Owed,
) -> None:
    async with sink:
        buffer = bytearray()
        while chunk := await stdout.read(65536):
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line, buffer = bytes(buffer[:end]), buffer[end + 1 :]
                if not line.strip():
                    continue
                item = _parse(line, hidden)
                broken = owed.asked(item, len(line))
                if broken is not None:
                    return await _end(sink, on_end, broken)
                if not await _deliver(sink, item):
                    return None
            if len(buffer) > max_line:
                return await _end(sink, on_end, LineTooLong(max_line))
        on_end(None)
    return None


async def _end(
    sink: MemoryObjectSendStream[SessionMessage | Exception], on_end: OnEnd, why: Broken
) -> None:
    """End the server's side: the owner is told why, the session gets it as an error."""
    on_end(why)
    await _deliver(sink, why)


def _ignore(_why: Broken | None) -> None:
    pass


async def _deliver(
    sink: MemoryObjectSendStream[SessionMessage | Exception], item: SessionMessage | Exception
) -> bool:
    try:
        await sink.send(item)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        return False
    return True


def _parse(line: bytes, hidden: Mapping[str, str]) -> SessionMessage | Exception:
    adapter = mcp_types.jsonrpc_message_adapter
    try:
        if hidden:  # parsed first: a string's escapes (`\u00e9`, `\/`) no longer hide it
            message = adapter.validate_python(cut_json(json.loads(line), hidden), by_name=False)
        else:
            message = adapter.validate_json(line, by_name=False)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        why = cut(str(exc), hidden)  # pydantic's error quotes the line
        log.warning("an MCP server wrote a line that is not JSON-RPC: %s", why[:200])
        return ValueError(why) if hidden else exc
    return SessionMessage(message)


async def _writer(
    stdin: asyncio.StreamWriter, source: MemoryObjectReceiveStream[SessionMessage], owed: _Owed
) -> None:
    async with source:
        with contextlib.suppress(ConnectionError, OSError, anyio.ClosedResourceError):
            async for item in source:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                stdin.write(data.encode() + b"\n")
                await stdin.drain()
                owed.answered(item.message)
