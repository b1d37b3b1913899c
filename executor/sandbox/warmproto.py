"""What the daemon and a warm sandbox's supervisor say to each other (stdlib only).

Like nsops.py this runs on both sides: the supervisor imports it by file name
inside the sandbox. Every message is one SOCK_SEQPACKET datagram: a JSON object,
and the descriptors it hands over (SCM_RIGHTS, received close-on-exec). A body
too long for one datagram travels in a memfd instead (`BODY_FD`).

The conversation (see bwrap_warm.py for the daemon's side, supervisor.py for the other):

    supervisor -> daemon   {"op": "ready"}, once, when it serves
    daemon -> supervisor   {"op": "host", "limits": {...}}  + [park leaves...]
    supervisor -> daemon   {"op": "host", "pid": N}         + [pidfd, socket of the host]
    host -> daemon         {"op": "prepared"} when ready for a call (first, and after each)
    daemon -> host         {"op": "run", ...}      + [stdout, stderr, stdin?, leaves...]
    host -> daemon         {"op": "started"} | {"op": "refused", "kind": K, "message": M}
    host -> daemon         {"op": "exit", "code": C} | {"op": "exit", "signal": S}

A host is a process the supervisor forked: the init of a PID namespace of its own,
with its own mount, IPC and network namespaces. It runs the daemon's calls one
after another (see supervisor.py).
"""

from __future__ import annotations

import array
import json
import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported inside the sandbox (see supervisor.py)
    from collections.abc import Sequence
    from typing import Any

# Close to the smallest socket buffer a host may have: a body over it goes in a memfd.
MAX_INLINE = 48 * 1024
MAX_FDS = 16
BODY_FD = "body_fd"

# What a host refuses a call for: a program not found or not executable (the message is
# its name), a declared write path it cannot open, an exec that failed otherwise (an
# argument list too long), anything else of its setup (then the host ends).
NOT_FOUND, NOT_EXECUTABLE, WRITE_PATH = "not_found", "not_executable", "write_path"
SPAWN, SETUP = "spawn", "setup"


def send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """Send one message (blocking sockets; a datagram this small never waits)."""
    body = json.dumps(message, separators=(",", ":")).encode()
    extra: list[int] = list(fds)
    memfd = -1
    if len(body) > MAX_INLINE:
        memfd = os.memfd_create("execgate-body", os.MFD_CLOEXEC)
        os.write(memfd, body)
        body = json.dumps({BODY_FD: len(extra)}).encode()
        extra.append(memfd)
    try:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", extra))]
        sock.sendmsg([body], ancillary if extra else [])
    finally:
        if memfd >= 0:
            os.close(memfd)


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One message and its descriptors; None at the end of the stream."""
    space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
    data, ancdata, _, _ = sock.recvmsg(MAX_INLINE + 1024, space, socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
            fds += list(got)
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    message = json.loads(data)
    if isinstance(message, dict) and BODY_FD in message:
        memfd = fds.pop(message[BODY_FD])
        try:
            message = json.loads(_read_all(memfd))
        finally:
            os.close(memfd)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message, fds


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)
