"""The bridge's stdio: the SDK's own framing (`stdio_server`) over the event loop's pipes.

The SDK reads stdin and writes stdout through worker threads (`anyio.wrap_file`), so every
message crosses threads on its way in and out; measured on the 2-core machine, serving the
same framing on asyncio's pipe transports instead took 0.5-1 ms off each `tools/call`
(bench/mcp_bridge.py). `stdio_server` takes the streams it frames as arguments; these
give it lines read from, and text written to, private duplicates of fds 0 and 1.

As the SDK does for its own streams, fds 0 and 1 are diverted while serving (0 to the
null device, 1 to stderr), so nothing a library or a child process prints can corrupt the
wire, and restored afterwards. Only a pipe or a socket is served this way: on a terminal
(or a file) the SDK's own threads serve, since a non-blocking terminal would outlive us.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import stat
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, cast

import anyio
from mcp.server.stdio import stdio_server

if TYPE_CHECKING:
    from mcp.shared._stream_protocols import ReadStream, WriteStream
    from mcp.shared.message import SessionMessage

__all__ = ["served_stdio"]

# The longest line (one JSON-RPC message) read: the daemon's own message bound.
MAX_LINE = 64 * 1024 * 1024


class _Lines:
    """Lines of text from a pipe: what `stdio_server` iterates its stdin for."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class _Text:
    """Text to a pipe: what `stdio_server` writes and flushes its stdout with. A client
    gone (its end closed) closes the stream, which ends the SDK's writer quietly."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, text: str) -> None:
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        try:
            await self._writer.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise anyio.ClosedResourceError from exc


def _pipe_or_socket(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@contextlib.asynccontextmanager
async def served_stdio() -> AsyncIterator[
    tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]
]:
    """The SDK's `stdio_server` streams, over the loop's pipes where stdin and stdout
    are pipes or sockets (else over the SDK's own threads)."""
    if not (_pipe_or_socket(0) and _pipe_or_socket(1)):
        async with stdio_server() as streams:
            yield streams
        return
    with _diverted() as (wire_in, wire_out):
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE)
        read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0)
        )
        write_transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0)
        )
        writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
        try:
            # stdio_server reads lines and writes text; it is typed for anyio's files.
            lines = cast("anyio.AsyncFile[str]", _Lines(reader))
            text = cast("anyio.AsyncFile[str]", _Text(writer))
            async with stdio_server(stdin=lines, stdout=text) as streams:
                yield streams
        finally:
            read_transport.close()
            write_transport.close()


@contextlib.contextmanager
def _diverted() -> Iterator[tuple[int, int]]:
    """Private duplicates of fds 0 and 1 (the wire, for the caller's transports to own)
    while fd 0 reads the null device and fd 1 writes to stderr; both restored on exit."""
    saved = (_dup(0), _dup(1))
    wire = (_dup(0), _dup(1))
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
    finally:
        os.close(null)
    try:
        yield wire
    finally:
        for fd, copy in enumerate(saved):
            os.dup2(copy, fd)
            os.close(copy)
            # The loop's transports made the pipe non-blocking; its other holders expect
            # it as it was.
            os.set_blocking(fd, True)


def _dup(fd: int) -> int:
    """A duplicate above the standard descriptors, closed on exec (never a child's)."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
