"""A container's stdio over dockerd's hijacked attach and exec connections.

Without a TTY, dockerd multiplexes stdout and stderr onto one connection in frames:
a header (the stream, 1 or 2; three zero bytes; the length, big-endian), then that
many bytes. `Frames` splits them as bytes arrive, however the reads cut them.

`Stdio` is a call's: it feeds the call's stdin and keeps `cap` bytes of stdout and of
stderr, with a thread per direction. `ServerStdio` is a long-lived server's
(`Launch.serve`): stdin and stdout are asyncio streams the caller speaks a protocol
over, on two connections of their own -- stdin alone on one, so closing it ends the
server's stdin (the container is created with StdinOnce) while its output goes on
arriving on the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from typing import Any

from .base import Captured, SandboxError
from .dockerd import close_socket, in_thread
from .spawn import Sink

# After the call stops, read what output is there, then stop waiting (as process.py does).
OUTPUT_SETTLE_SECONDS = 1.0
# A server's stdout buffered here before dockerd's connection is paused (the reader's
# limit; asyncio pauses at twice that). A message may be longer: it is read in pieces.
SERVER_STDOUT_LIMIT = 1 << 20
_HEADER = struct.Struct(">BxxxL")


class Frames:
    """Splits dockerd's multiplexed stream into (stream, bytes) pieces."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._stream = 0
        self._left = 0  # bytes of the current frame still to come

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        pieces = []
        pos = 0
        while pos < len(data):
            if self._left == 0:
                take = min(_HEADER.size - len(self._head), len(data) - pos)
                self._head += data[pos : pos + take]
                pos += take
                if len(self._head) == _HEADER.size:
                    self._stream, self._left = _HEADER.unpack(self._head)
                    self._head.clear()
                continue
            take = min(self._left, len(data) - pos)
            pieces.append((self._stream, data[pos : pos + take]))
            self._left -= take
            pos += take
        return pieces


class Stdio:
    """A call's hijacked attach or exec connection: feeds stdin, keeps `cap` bytes of
    stdout and of stderr (counting the rest). Each direction has a thread of its own,
    so a command that writes before it reads cannot deadlock against us."""

    def __init__(self, sio: Any, stdin: bytes | None, cap: int) -> None:
        self._sio = sio
        # The SDK hands out a SocketIO: shutdown needs the socket under it.
        self._sock: socket.socket = getattr(sio, "_sock", sio)
        # The client's request timeout must not end the stream of a quiet call.
        self._sock.settimeout(None)
        self._sinks = (Sink(cap), Sink(cap))
        # Done when the stream ends: the command and whatever inherited its stdio are gone.
        self.ended = in_thread(self._pump, "docker-output")
        if stdin is not None:
            feed = threading.Thread(target=self._feed, args=(stdin,), name="docker-stdin")
            feed.daemon = True
            feed.start()

    def _feed(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self._sock.sendall(data)
            self._sock.shutdown(socket.SHUT_WR)  # EOF on the command's stdin

    def _pump(self) -> None:
        frames = Frames()
        while chunk := self._recv(65536):
            for stream, piece in frames.feed(chunk):
                if stream in (1, 2):
                    self._sinks[stream - 1].add(piece)

    def _recv(self, n: int) -> bytes:
        try:
            return self._sock.recv(n)
        except OSError:  # shut down under us by `close`
            return b""

    async def result(self) -> tuple[Captured, Captured]:
        """What was read: all of it, unless something still holds the stream open."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.ended), OUTPUT_SETTLE_SECONDS)
        out, err = self._sinks
        return out.captured(), err.captured()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked on it
        close_socket(self._sio)


class _Output(asyncio.Protocol):
    """A server's output connection: stdout into the caller's reader, stderr kept.

    The reader runs the connection's flow control (`set_transport`): once the caller
    leaves `SERVER_STDOUT_LIMIT` bytes unread, reading from dockerd pauses, and with
    it the server's writes -- as a full pipe would hold a host process."""

    def __init__(self, stdout: asyncio.StreamReader, cap: int) -> None:
        self.stdout = stdout
        self.stderr = Sink(cap)
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._frames = Frames()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.stdout.set_transport(transport)

    def data_received(self, data: bytes) -> None:
        for stream, piece in self._frames.feed(data):
            if stream == 1:
                self.stdout.feed_data(piece)
            elif stream == 2:
                self.stderr.add(piece)

    def eof_received(self) -> bool | None:
        self.stdout.feed_eof()
        return None  # close the connection: the container has stopped

    def connection_lost(self, exc: Exception | None) -> None:
        self.stdout.feed_eof()
        if not self.ended.done():
            self.ended.set_result(None)


class ServerStdio:
    """A server's stdin and stdout as asyncio streams, its stderr kept (`cap` bytes)."""

    def __init__(
        self, stdin: asyncio.StreamWriter, output: _Output, transport: asyncio.BaseTransport
    ) -> None:
        self.stdin = stdin
        self.stdout = output.stdout
        self._output = output
        self._transport = transport

    @classmethod
    async def open(cls, stdin_sio: Any, output_sio: Any, cap: int) -> ServerStdio:
        """Take over the two hijacked connections (the SDK's objects are closed)."""
        stdin_sock, output_sock = _own(stdin_sio, output_sio)
        try:
            _, writer = await asyncio.open_connection(sock=stdin_sock)
        except BaseException:
            stdin_sock.close()
            output_sock.close()
            raise
        try:
            output = _Output(asyncio.StreamReader(SERVER_STDOUT_LIMIT), cap)
            loop = asyncio.get_running_loop()
            transport, _ = await loop.create_connection(lambda: output, sock=output_sock)
        except BaseException:
            writer.close()
            output_sock.close()
            raise
        return cls(writer, output, transport)

    async def result(self) -> tuple[Captured, Captured]:
        """stdout was the caller's (reported empty); stderr once the stream has ended
        or OUTPUT_SETTLE_SECONDS passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._output.ended), OUTPUT_SETTLE_SECONDS)
        return Captured(), self._output.stderr.captured()

    def close(self) -> None:
        self.stdin.close()
        self._transport.close()


def _own(*sios: Any) -> list[socket.socket]:
    """Sockets of our own on hijacked connections; the SDK's objects are closed.

    asyncio can take over a plain socket only: dockerd behind TLS or ssh (DOCKER_HOST)
    cannot serve a server's stdio here."""
    raws = [getattr(sio, "_sock", None) for sio in sios]
    plain = all(type(raw) is socket.socket for raw in raws)
    mine = [raw.dup() for raw in raws if isinstance(raw, socket.socket)] if plain else []
    for sio in sios:
        close_socket(sio)
    if not plain:
        raise SandboxError(
            "docker: a server's stdio needs dockerd on a unix socket or plain tcp, "
            "not TLS or ssh (DOCKER_HOST)"
        )
    return mine
