"""One call in a warm bwrap sandbox: handed to a host, watched, stopped, given back.

The daemon takes an idle host of the sandbox (bwrap_warm.py) and a cgroup leaf made
in advance (warm_leaves.py), creates the call's pipes and sends the host the request:
argv, environment, cwd, the workspace's mode and declared write paths, rlimits, the
pipes and the leaf. The host reports `started` (or why it refused: a program not
found, a write path swapped for a symlink), then the command's exit, once every
process of its namespace is gone.

What stops it, as in a cold bwrap call (bwrap.py): the polite SIGTERM goes to every
process of the call's PID namespace but its init (the host does it, `kill(-1)`, on
SIGUSR1); force is SIGKILL to the host, the namespace's init, upon which the kernel
kills everything in the namespace, setsid'd and double-forked processes included.
Both go through a pidfd. So `survivors` is a fact, not a /proc scan, once the host
has reported the exit or is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from execgate.executor.core import clock

from . import procscan, warmproto
from .base import MARKER_ENV, Captured, Confinement, Exit, Launch, SandboxError
from .bwrap_warm import Host, Limits, WarmBox, discard
from .cgroup import CallCgroup
from .pidwatch import PidWatch
from .process import OUTPUT_SETTLE_SECONDS, ProgramNotExecutable, ProgramNotFound
from .spawn import Pipes
from .stopping import off_loop


class HostGone(SandboxError):
    """The host ended before it took the call (it may be retried on another)."""


class SpawnFailed(SandboxError):
    """The exec of the command failed (an argument list too long, ...)."""


# The refusals after which the host is set back and takes the next call.
_REFUSED: dict[str, type[SandboxError]] = {
    warmproto.NOT_FOUND: ProgramNotFound,
    warmproto.NOT_EXECUTABLE: ProgramNotExecutable,
    warmproto.SPAWN: SpawnFailed,
    warmproto.WRITE_PATH: SandboxError,
}


class Streams:
    """The daemon's ends of a call's pipes, as `Pipes` reads and feeds them."""

    def __init__(
        self,
        stdin: asyncio.StreamWriter | None,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr


class WarmRunning:
    """A call running in a host of a warm sandbox (base.Running).

    Invariant: `_status` is set exactly once: by the host's exit report (its namespace
    then holds nobody but the host) or by the end of its socket (the host is gone).
    """

    def __init__(self, box: WarmBox, host: Host, group: CallCgroup | None) -> None:
        self.box = box
        self.host = host
        self.group = group
        self.pipes: Pipes | None = None
        self.init = _host_pid(host.pidfd)
        where = f", cgroup {group.dirs[0].name}" if group is not None and group.dirs else ""
        self.description = f"warm bwrap {box.pid}, call init {self.init}{where}"
        # A pidfd of our own: the host's outlives this call.
        self.watch = PidWatch(self.init, os.dup(host.pidfd))
        loop = asyncio.get_running_loop()
        self._started: asyncio.Future[None] = loop.create_future()
        self._status: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._reported_at: float | None = None
        # The host refused the call and set itself back: it may take the next.
        self._reusable = False
        self._released = False
        loop.add_reader(host.sock.fileno(), self._on_report)

    def _on_report(self) -> None:
        while not self._status.done():
            try:
                got = warmproto.receive(self.host.sock)
            except BlockingIOError:
                return
            except (OSError, ValueError):
                got = None
            if got is None:
                self._gone()
                return
            message, fds = got
            for fd in fds:
                os.close(fd)
            self._report(message)

    def _report(self, message: dict[str, Any]) -> None:
        match message.get("op"):
            case "started":
                _settle(self._started, None)
            case "refused" if message.get("kind") == warmproto.SETUP:
                self.box.doom()  # a host that cannot set up: its sandbox is broken
                _fail(self._started, SandboxError(str(message.get("message"))))
            case "refused":
                kind, why = str(message.get("kind")), str(message.get("message"))
                self._reusable = kind in _REFUSED
                # For a program not found or not executable the message is its name.
                _fail(self._started, _REFUSED.get(kind, SandboxError)(why))
            case "exit":
                self._reported_at = clock.now()
                _settle(self._status, message)

    def _gone(self) -> None:
        """The host's socket ended: it is gone (killed, or it could not go on)."""
        self._unwatch()
        _fail(self._started, HostGone("the warm sandbox's call host ended"))
        _settle(self._status, {"signal": int(signal.SIGKILL)})

    def _unwatch(self) -> None:
        with contextlib.suppress(ValueError, RuntimeError, OSError):
            asyncio.get_running_loop().remove_reader(self.host.sock.fileno())

    async def wait(self) -> Exit:
        status = await asyncio.shield(self._status)
        at = self._reported_at
        if at is None:  # the host is gone: its namespace is empty once it has exited
            await self.watch.ended.wait()
            at = self.watch.gone_at
        oom = self.group.oom_killed() if self.group is not None else False
        sig = status.get("signal")
        if sig is not None:
            return Exit(None, int(sig), oom, at=at)
        return Exit(int(status.get("code", 0)), None, oom, at=at)

    async def finish(self) -> None:
        """Nothing to do: the host reports the exit once its namespace is empty."""

    async def terminate(self) -> str:
        if self.watch.send(signal.SIGUSR1):
            return "SIGTERM to every process of the call's PID namespace but its init"
        return "nothing to signal: the call's namespace is gone"

    async def kill(self) -> str:
        if self.watch.send(signal.SIGKILL):
            return "SIGKILL to the init of the call's PID namespace (the kernel kills it all)"
        return "nothing left to kill: the call's namespace is gone"

    async def survivors(self) -> list[int]:
        if self._reported_at is not None or not self.watch.alive():
            return []  # reported empty by its init, or its init is gone (and so is it all)
        group, init = self.group, self.init

        def scan() -> list[int]:
            if group is not None:  # the command's processes are in it, the host is not
                return sorted(p for p in group.procs() if procscan.alive(p))
            ns = procscan.pid_namespace(init)
            return [p for p in procscan.in_namespace(ns) if p != init] if ns else []

        return await off_loop(scan)

    async def output(self) -> tuple[Captured, Captured]:
        assert self.pipes is not None
        return await self.pipes.result(OUTPUT_SETTLE_SECONDS)

    def hand(self, launch: Launch, fds: list[int]) -> None:
        """Send the host the call (a host found gone: `took` says so)."""
        group = self.group
        dirs = group.dirs if group is not None else ()
        leaves = [os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for d in dirs]
        try:
            warmproto.send(self.host.sock, request(launch), [*fds, *leaves])
        except OSError:
            self._gone()
        finally:
            for fd in leaves:
                os.close(fd)

    async def took(self) -> bool:
        """True once the command runs; False if the host had ended (try another);
        raises what the host refused the call for."""
        try:
            await asyncio.shield(self._started)
        except HostGone:
            return False
        return True

    def abandon(self) -> None:
        """Forget a host that ended before it took the call."""
        self._unwatch()
        self.watch.close()
        discard(self.host)

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._unwatch()
        # Reusable: it reported the exit (its namespace is empty again), or refused the
        # call for its own reasons and set itself back.
        reusable = self._reported_at is not None or self._reusable
        if not reusable and self.watch.alive():  # our own task was cancelled mid-call
            self.watch.send(signal.SIGKILL)
        self.watch.close()
        if self.pipes is not None:
            self.pipes.cancel()
        if reusable and not self.box.dead:
            self.box.give_back(self.host)
        else:
            discard(self.host)
        self.box.leaves.done(self.group)  # nothing of the call is alive in it
        self.group = None
        self.box.leave()


async def start_call(
    box: WarmBox, launch: Launch, group: CallCgroup | None, limits: Limits
) -> WarmRunning:
    """Hand `launch` to a host of `box` with `limits`, its command in `group`; returns
    once the command runs. The caller has entered `box` and taken `group`: both are
    given back if the call does not start."""
    pipes = _Pipes(launch)
    running: WarmRunning | None = None
    try:
        for _ in range(2):  # an idle host may have ended since: one more try
            running = WarmRunning(box, await box.take(limits), group)
            running.hand(launch, pipes.theirs)
            if await running.took():
                break
            running.abandon()
            running = None
        if running is None:
            raise SandboxError("the warm sandbox's call hosts end before they take a call")
        running.pipes = Pipes(await pipes.streams(), launch.stdin, launch.output_cap)
        return running
    except BaseException:
        pipes.close()
        if running is not None:
            await running.release()
        else:
            box.leaves.done(group)
            box.leave()
        raise


def rlimits(conf: Confinement, group: CallCgroup | None) -> Limits:
    """The rlimits of a call: a cold sandbox's (its launcher's `ulimit`s); processes and
    memory only where its cgroup leaf does not limit them."""
    limits = {"cpu": conf.cpu_seconds, "fsize": conf.file_size_bytes, "nofile": conf.open_files}
    if group is None or not group.limits_pids:
        limits["nproc"] = conf.processes
    if group is None or not group.limits_memory:
        limits["as"] = conf.memory_bytes
    return tuple(sorted(limits.items()))


class _Pipes:
    """A call's pipes: the ends the host gets (`theirs`) and the daemon's."""

    def __init__(self, launch: Launch) -> None:
        self._fds: list[int] = []
        out_r, out_w = self._pipe()
        err_r, err_w = self._pipe()
        self.theirs = [out_w, err_w]
        self._ours = [out_r, err_r, -1]
        if launch.stdin is not None:
            in_r, in_w = self._pipe()
            self.theirs.append(in_r)
            self._ours[2] = in_w

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe2(os.O_CLOEXEC)
        self._fds += [r, w]
        return r, w

    async def streams(self) -> Streams:
        """Ours as asyncio streams (theirs closed: the host has its copies)."""
        for fd in self.theirs:
            self._fds.remove(fd)
            os.close(fd)
        out_r, err_r, in_w = self._ours
        loop = asyncio.get_running_loop()
        readers = []
        for fd in (out_r, err_r):
            reader = asyncio.StreamReader(limit=1 << 20, loop=loop)
            self._fds.remove(fd)
            pipe = os.fdopen(fd, "rb", buffering=0)
            await loop.connect_read_pipe(_protocol(reader), pipe)
            readers.append(reader)
        writer = None
        if in_w >= 0:
            self._fds.remove(in_w)
            pipe = os.fdopen(in_w, "wb", buffering=0)
            transport, protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, pipe
            )
            writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return Streams(writer, readers[0], readers[1])

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def _protocol(reader: asyncio.StreamReader) -> Callable[[], asyncio.StreamReaderProtocol]:
    return lambda: asyncio.StreamReaderProtocol(reader)


def request(launch: Launch) -> dict[str, Any]:
    return {
        "op": "run",
        "argv": list(launch.argv),
        "env": {**launch.env, MARKER_ENV: launch.marker},
        "cwd": str(launch.cwd),
        "writable": launch.writable,
        "writes": [os.path.relpath(p, launch.workspace) for p in launch.write_paths],
        "stdin": launch.stdin is not None,
    }


def _host_pid(pidfd: int) -> int:
    """The pid a pidfd names, as this daemon sees it (0 once it has exited)."""
    try:
        for line in Path(f"/proc/self/fdinfo/{pidfd}").read_text().splitlines():
            if line.startswith("Pid:"):
                return max(int(line.split()[1]), 0)
    except (OSError, ValueError):
        pass
    return 0


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
        future.add_done_callback(lambda f: f.exception())  # retrieved, even if nobody awaits
