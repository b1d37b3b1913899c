"""Warm mode of the `docker` backend: a run's calls as execs in one long-lived container.

The container is made on the run's first call, like a per-call one but running a
command that only waits, and is shared by every call of the same run, workspace,
user, write mode, declared write paths and limits (a container's mounts cannot
change: a run whose commands declare different writes gets a container for each). An
exec saves the container start (about 0.25 s here), but has no namespace of its own:
a call's processes are the container's processes that carry its marker (MARKER_ENV),
read from /proc -- which needs the daemon to run as root in dockerd's PID namespace
(`DockerSandbox.probe` checks the first). SIGTERM goes to every marked process;
force SIGKILLs them and discards the container, which also ends anything that
cleared its environment; the run's next call gets a new one. A container idle for
WARM_IDLE_SECONDS is removed when the next call comes; `DockerSandbox.close` removes
the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import procscan
from .base import MARKER_ENV, Captured, Exit, Launch
from .docker_io import Stdio
from .dockerd import ContainerGone, Dockerd, container_user, exit_of
from .stopping import off_loop

# The warm container's command: wait, and exit at once on SIGTERM. Needs sh in the image.
WAITER = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]
# The API has no blocking wait for an exec: poll it, less often as the call goes on
# (once its output stream has ended, from EXEC_POLL_AFTER).
EXEC_POLL_FIRST, EXEC_POLL_AFTER, EXEC_POLL_MAX = 0.005, 0.001, 0.1
WARM_IDLE_SECONDS = 600.0


@dataclass(eq=False)
class Warm:
    cid: str
    # The container's init as a host pid: where its memory cgroup is found.
    pid: int
    # Calls started in it and not yet released.
    users: int = 0
    # Never handed to a new call; removed when its last call is released.
    doomed: bool = False
    removed: bool = False
    idle_since: float = field(default_factory=time.monotonic)
    # A pidfd of its init where this daemon sees it: whether it still runs, without
    # asking dockerd at every call (an inspect costs milliseconds).
    pidfd: int | None = None

    def running(self) -> bool | None:
        """Does its init run? None: not known here (ask dockerd)."""
        if self.pidfd is None:
            return None
        readable, _, _ = select.select([self.pidfd], [], [], 0)
        return not readable

    def forget_pid(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class WarmPool:
    """The warm containers, one per (run, workspace, user, write mode and paths, limits).

    Invariant: a container in `_by_key` is not doomed; a doomed one is removed
    as soon as no call is in it.
    """

    def __init__(self, dockerd: Dockerd) -> None:
        self.dockerd = dockerd
        self._by_key: dict[tuple[object, ...], Warm] = {}
        # Retired by `run_ended` with no call in them: removed at the next start.
        self._dropped: list[Warm] = []
        self._lock = asyncio.Lock()

    async def start(self, launch: Launch) -> ExecRunning:
        warm = await self._enter(launch)
        # dockerd reports OOMKilled only for a stopped container: count the cgroup's kills.
        ooms = oom_kills(warm.pid)
        try:
            exec_id, sio = await asyncio.to_thread(self.dockerd.start_exec, warm.cid, launch)
        except BaseException:
            await self.leave(warm)
            raise
        stdio = Stdio(sio, launch.stdin, launch.output_cap)
        return ExecRunning(self, warm, exec_id, stdio, launch.marker, ooms)

    async def _enter(self, launch: Launch) -> Warm:
        user = container_user(launch.workspace)
        key = (
            launch.run_id,
            launch.workspace,
            user,
            launch.writable,
            launch.write_paths,
            launch.confinement,
        )
        async with self._lock:
            await self._expire()
            warm = self._by_key.get(key)
            # Its init may be gone (the OOM killer picks the biggest process, not the call's).
            if warm is not None and not await self._running(warm):
                await self._retire(warm, warm.users)
                warm = None
            if warm is None:
                cid, pid = await asyncio.to_thread(self.dockerd.start_waiting, launch, WAITER)
                warm = self._by_key[key] = Warm(cid, pid, pidfd=_pidfd_of(pid, cid))
            warm.users += 1
            return warm

    async def _running(self, warm: Warm) -> bool:
        known = warm.running()
        if known is not None:
            return known
        return await asyncio.to_thread(self.dockerd.running, warm.cid)

    async def _expire(self) -> None:
        dropped, self._dropped = self._dropped, []
        for warm in dropped:
            if warm.users == 0:
                await self._remove(warm)
        idle = time.monotonic() - WARM_IDLE_SECONDS
        for warm in list(self._by_key.values()):
            if warm.users == 0 and warm.idle_since < idle:
                await self._retire(warm, 0)

    def discard(self, warm: Warm) -> str:
        """Retire `warm` after force-terminating one of its calls. If that call is its
        only one, its init is SIGKILLed at once (the kernel ends everything in it, a
        process that cleared its marker included) and it is removed when the call is
        released; else it goes once the others end (they are not killed with it)."""
        others = warm.users - 1
        warm.doomed = True
        self._by_key = {k: w for k, w in self._by_key.items() if w is not warm}
        if others == 0 and _kill_init(warm):
            return f"SIGKILL to warm container {warm.cid[:12]}'s init (removed after the call)"
        return f"warm container {warm.cid[:12]} retired ({others} other call(s) still in it)"

    async def _retire(self, warm: Warm, users: int) -> bool:
        """Never hand `warm` to a new call; remove it now if `users` is 0. True if removed."""
        warm.doomed = True
        self._by_key = {k: w for k, w in self._by_key.items() if w is not warm}
        if users > 0:
            return False
        await self._remove(warm)
        return True

    async def leave(self, warm: Warm) -> None:
        warm.users -= 1
        warm.idle_since = time.monotonic()
        if warm.doomed and warm.users == 0:
            await self._remove(warm)

    async def _remove(self, warm: Warm) -> None:
        if not warm.removed:
            warm.removed = True
            warm.forget_pid()
            await asyncio.to_thread(self.dockerd.remove, warm.cid)

    def run_ended(self, run_id: str) -> None:
        """Retire the run's containers: each is removed when its last call is released
        (or when the next call comes, if it has none: `_expire` sees it doomed)."""
        for key, warm in list(self._by_key.items()):
            if key[0] == run_id:
                warm.doomed = True
                self._by_key = {k: w for k, w in self._by_key.items() if w is not warm}
                self._dropped.append(warm)

    def forget(self) -> None:
        """Daemon shutdown: `DockerSandbox.close` removes every labelled container."""
        for warm in [*self._by_key.values(), *self._dropped]:
            warm.forget_pid()
        self._by_key.clear()


class ExecRunning:
    """A call running as an exec in its run's warm container."""

    def __init__(
        self, pool: WarmPool, warm: Warm, exec_id: str, stdio: Stdio, marker: str, ooms: int
    ) -> None:
        self.pool = pool
        self.warm = warm
        self.exec_id = exec_id
        self.stdio = stdio
        self.marker = marker
        self.description = f"exec {exec_id[:12]} in warm container {warm.cid[:12]}"
        # OOM kills in the container before the call started.
        self._ooms = ooms
        self._signalled = False
        # Force-killed: once its output stream has ended (all that held it are dead),
        # dockerd's view of the exec adds nothing.
        self._killed = False
        self._released = False

    async def wait(self) -> Exit:
        """Until dockerd reports the exec's exit. It is asked when the exec's output
        stream ends (the command and whatever shared its stdio are gone), else now and
        then: a poll while the command surely runs is a wasted round trip to dockerd."""
        ended = self.stdio.ended
        quiet, after = EXEC_POLL_FIRST, EXEC_POLL_AFTER
        while True:
            if not ended.done():
                await asyncio.wait({ended}, timeout=quiet)
                quiet = min(quiet * 2, EXEC_POLL_MAX)
            if self._killed and ended.done():
                return Exit(None, int(signal.SIGKILL))
            try:
                code = await asyncio.to_thread(self.pool.dockerd.exec_status, self.exec_id)
            except ContainerGone:  # discarded by `kill`
                return Exit(None, int(signal.SIGKILL))
            if code is not None:
                return exit_of(code, oom_kills(self.warm.pid) > self._ooms, self._signalled)
            if ended.done():  # dockerd is about to see the exit it has just relayed
                await asyncio.sleep(after)
                after = min(after * 2, EXEC_POLL_MAX)

    async def finish(self) -> None:
        """The command exited, but the container lives on: end what it left running."""
        await off_loop(signal_marked, self.marker, signal.SIGKILL)

    async def terminate(self) -> str:
        # A /proc scan (about 1 ms per 100 processes): in a thread, as bwrap's.
        self._signalled = True
        count = await off_loop(signal_marked, self.marker, signal.SIGTERM)
        return f"SIGTERM to the {count} process(es) of exec {self.exec_id[:12]}"

    async def kill(self) -> str:
        self._signalled = True
        self._killed = True
        count = await off_loop(signal_marked, self.marker, signal.SIGKILL)
        return f"SIGKILL to {count} marked process(es); " + self.pool.discard(self.warm)

    async def survivors(self) -> list[int]:
        return await off_loop(procscan.with_marker, MARKER_ENV, self.marker)

    async def output(self) -> tuple[Captured, Captured]:
        return await self.stdio.result()

    async def release(self) -> None:
        if not self._released:
            self._released = True
            self.stdio.close()
            await self.pool.leave(self.warm)


def _pidfd_of(pid: int, cid: str) -> int | None:
    """A pidfd of container `cid`'s init, if host pid `pid` is it here (not when this
    daemon runs in a PID namespace of its own)."""
    try:
        if cid not in Path(f"/proc/{pid}/cgroup").read_text():
            return None
        return os.pidfd_open(pid)
    except OSError:
        return None


def _kill_init(warm: Warm) -> bool:
    """SIGKILL a warm container's init through its pidfd; False if it cannot here."""
    if warm.pidfd is None:
        return False
    try:
        signal.pidfd_send_signal(warm.pidfd, signal.SIGKILL)
    except OSError:
        return False
    return True


def signal_marked(marker: str, sig: int) -> int:
    """Send `sig` to every live process carrying the call's marker; returns how many."""
    pids = procscan.with_marker(MARKER_ENV, marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return len(pids)


def oom_kills(pid: int) -> int:
    """OOM kills so far in the memory cgroup of host process `pid` (0 if unreadable)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return 0
    files: list[Path] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1 (or the v1 half of a hybrid host)
            files.insert(0, Path(f"/sys/fs/cgroup/memory{path}/memory.oom_control"))
        elif controllers == "":
            files.append(Path(f"/sys/fs/cgroup{path}/memory.events"))
    for file in files:
        with contextlib.suppress(OSError, ValueError):
            for entry in file.read_text().splitlines():
                key, _, value = entry.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0
