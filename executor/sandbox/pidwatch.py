"""Watching a process the daemon did not spawn (a container's init) through a pidfd.

A pidfd tells the moment the process ends (it becomes readable), and a signal
sent through it can never hit another process that reused the pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal

from execgate.executor.core import clock


class PidWatch:
    """`fd`: a pidfd someone else opened (a warm sandbox's supervisor sent it); it is
    ours to close from then on."""

    def __init__(self, pid: int, fd: int | None = None) -> None:
        # Wall-clock time the process was seen to end; None while it runs.
        self.gone_at: float | None = None
        self.ended = asyncio.Event()
        self._fd: int | None = None
        if fd is None:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                self.gone_at = clock.now()
                self.ended.set()
                return
            except OSError:  # no pidfds here (old kernel, seccomp): nothing is watched
                return
        self._fd = fd
        asyncio.get_running_loop().add_reader(fd, self._ended)

    @property
    def watching(self) -> bool:
        return self._fd is not None or self.ended.is_set()

    def alive(self) -> bool:
        """Not yet exited -- so its pid (and process group id) cannot have been reused."""
        if self._fd is None:
            return False
        readable, _, _ = select.select([self._fd], [], [], 0)
        return not readable

    def _ended(self) -> None:
        self.gone_at = clock.now()
        self.ended.set()
        self.close()

    def send(self, sig: int) -> bool:
        """Signal the process; False if it cannot be done this way (gone, not ours)."""
        if self._fd is None:
            return False
        try:
            signal.pidfd_send_signal(self._fd, sig)
        except OSError:
            return False
        return True

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(ValueError, RuntimeError):
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
