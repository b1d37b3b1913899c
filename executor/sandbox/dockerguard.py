"""The docker backend's guard: a helper process that removes this daemon's containers
when the daemon dies without removing them itself (SIGKILL, a crash).

bwrap ties a call to the daemon with `--die-with-parent`; a container is dockerd's
child, not ours, and nothing in the kernel ends it with us. A server's container is
created with StdinOnce, so when the daemon dies dockerd closes the server's stdin and
a server that exits on EOF ends by itself -- but a server that ignores EOF, or a call
still running, would live on. So the daemon starts this guard before its first
container: a process in a session of its own (a signal to the daemon's process group
misses it; it ignores SIGINT, SIGTERM and SIGHUP), whose stdin is a pipe only the
daemon holds the other end of (close-on-exec: no call inherits it). When the daemon
dies the kernel closes that end: the guard reads EOF and force-removes every
container labelled with this daemon process's instance, twice, SWEEP_GAP_SECONDS
apart (a create in flight when the daemon died may land after the first sweep).
A daemon that shuts down cleanly has removed its containers; it writes QUIT first,
and the guard exits without sweeping.

If the guard dies with the daemon (a SIGKILL to both), the next daemon on the same
state dir removes what is left before it starts anything (`cleanup_stale`, by the
daemon-id label).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from .base import SandboxError
from .dockerd import Dockerd

log = logging.getLogger("execgate.sandbox")

MODULE = "execgate.executor.sandbox.dockerguard"
SWEEPS, SWEEP_GAP_SECONDS = 2, 1.0
# Written by a daemon that removed its containers itself: exit without sweeping.
QUIT = b"q"
# How long a daemon's shutdown waits for its guard (a sweep takes about a second).
QUIT_WAIT_SECONDS = 5.0


class Guard:
    """The daemon's side: the guard process, started on first need and again if it died.
    Blocking (it runs where containers are made, off the event loop)."""

    def __init__(self, daemon_id: str, instance: str) -> None:
        self.daemon_id = daemon_id
        self.instance = instance
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """A guard is running for this daemon process (SandboxError if none can be)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            if self._proc is not None:
                log.warning("docker guard exited (status %s); starting it again", self._proc.poll())
                self._discard()
            argv = [sys.executable, "-m", MODULE, self.daemon_id, self.instance]
            try:
                self._proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True
                )
            except OSError as exc:
                raise SandboxError(f"docker: cannot start the container guard: {exc}") from exc

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def close(self, *, swept: bool) -> None:
        """Daemon shutdown. `swept`: the daemon removed its containers, the guard quits;
        otherwise it sweeps first. Either way it is waited for (QUIT_WAIT_SECONDS)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None or proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            if swept:
                proc.stdin.write(QUIT)
            proc.stdin.close()
        try:
            proc.wait(QUIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("docker guard %d still sweeping at shutdown; left to finish", proc.pid)

    def _discard(self) -> None:
        assert self._proc is not None
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        self._proc = None


def main(argv: list[str], stdin: IO[bytes]) -> int:
    """The guard process: wait for the daemon's end, then sweep its containers."""
    daemon_id, instance = argv
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    if stdin.read() == QUIT:
        return 0
    dockerd = Dockerd("", daemon_id, instance=instance)
    removed, failed = 0, ""
    for sweep in range(SWEEPS):
        if sweep:
            time.sleep(SWEEP_GAP_SECONDS)
        try:
            removed += dockerd.remove_labelled(instance_only=True)
            failed = ""
        except SandboxError as exc:
            failed = exc.message
    if removed:
        print(f"execgate docker guard: removed {removed} container(s)", file=sys.stderr)
    if failed:
        print(f"execgate docker guard: {failed}; the next start removes them", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.stdin.buffer))
