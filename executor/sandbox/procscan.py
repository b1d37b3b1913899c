"""Finding a call's processes by reading /proc: by environment marker or by PID namespace.

The last-resort sweep: it finds processes that left the call's process group and
session (setsid, double fork) as long as they kept the marker in their
environment. Processes we may not read (another user's) are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

_PROC = "/proc"


def _pids() -> Iterator[int]:
    for name in os.listdir(_PROC):
        if name.isdigit():
            yield int(name)


def with_marker(name: str, value: str) -> list[int]:
    """Live (non-zombie) pids whose environment has name=value."""
    needle = f"{name}={value}".encode()
    found = []
    for pid in _pids():
        try:
            with open(f"{_PROC}/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if needle in env.split(b"\x00") and alive(pid):
            found.append(pid)
    return found


def pid_namespace(pid: int) -> str | None:
    """The PID namespace a process lives in ("pid:[4026532]"), None if it is gone."""
    try:
        return os.readlink(f"{_PROC}/{pid}/ns/pid")
    except OSError:
        return None


def in_namespace(ns: str) -> list[int]:
    """Live pids (as seen from here) of the processes inside PID namespace `ns`."""
    return [pid for pid in _pids() if pid_namespace(pid) == ns and alive(pid)]


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie has already stopped and only waits to be reaped."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may contain any byte.
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def children(pid: int) -> list[int]:
    """Direct children of `pid` (every thread's list)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"{_PROC}/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"{_PROC}/{pid}/task/{tid}/children") as f:
                kids += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return kids
