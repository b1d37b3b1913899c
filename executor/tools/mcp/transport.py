"""The SDK's message streams over a sandboxed server's stdin and stdout.

`mcp.client.stdio.stdio_client` spawns the server itself, which would bypass the
sandbox; this is the same newline-delimited JSON-RPC framing over streams the
sandbox gives us (`Serving.stdio`). Reading is bounded: a line longer than
`max_line` ends the read stream, so a server that floods stdout without a newline
cannot make the daemon hold it all. `on_end` tells the owner of the streams that
the server's side ended (its stdout closed, or a line too long): the session is
over whether or not the process still runs (connection.py then kills it).

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

from execgate.executor.core.errors import ExecgateError

from ..decl import MAX_MESSAGE_BYTES
from ..declguard import cut, cut_json

log = logging.getLogger("execgate.mcp")

# Bytes of one JSON-RPC message from a server; more ends the session (the tools
# file's `max_message_kb` sets it per server).
MAX_LINE_BYTES = MAX_MESSAGE_BYTES

Streams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]


class LineTooLong(ExecgateError):
    """The server wrote more than `limit` bytes without a newline."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a message from the server exceeded {limit} bytes")
        self.limit = limit


# Called once when the server's side of the streams ends: with the LineTooLong that
# ended it, or None when its stdout closed.
OnEnd = Callable[[LineTooLong | None], None]


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
    async with anyio.create_task_group() as tg:
        tg.start_soon(_reader, stdout, to_session, max_line, on_end or _ignore, hidden or {})
        tg.start_soon(_writer, stdin, from_session)
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
) -> None:
    async with sink:
        buffer = bytearray()
        while chunk := await stdout.read(65536):
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line, buffer = bytes(buffer[:end]), buffer[end + 1 :]
                if line.strip() and not await _deliver(sink, _parse(line, hidden)):
                    return
            if len(buffer) > max_line:
                too_long = LineTooLong(max_line)
                on_end(too_long)
                await _deliver(sink, too_long)
                return
        on_end(None)


def _ignore(_why: LineTooLong | None) -> None:
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
    stdin: asyncio.StreamWriter, source: MemoryObjectReceiveStream[SessionMessage]
) -> None:
    async with source:
        with contextlib.suppress(ConnectionError, OSError, anyio.ClosedResourceError):
            async for item in source:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                stdin.write(data.encode() + b"\n")
                await stdin.drain()
