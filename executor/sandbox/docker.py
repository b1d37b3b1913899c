"""The `docker` backend: each call in a hardened container of its own, or an exec in a warm one.

What a call's container gets: the image's file system read-only, a private 64 MiB
/tmp, the workspace bind-mounted at its host path (so cwd and paths mean the same
inside; read-write for a tool that may write, read-only otherwise; for a command
that declared its writes, read-only with each declared path mounted read-write over
it) and nothing else of the host; no network unless policy opens it (docker's bridge
then); every capability dropped and no-new-privileges; memory (= memory+swap: no
swap), pids and rlimits (cpu, fsize, nofile) from the Confinement; docker-init as
PID 1. It never runs as root: the user is the workspace's owner, or nobody (65534)
when root owns the workspace -- which then is, in practice, read-only for docker
calls.

Stopping a call's container: SIGTERM to the container (docker-init forwards it to
the command); force is SIGKILL to its init, upon which the kernel kills every
process in the container's PID namespace, setsid-escaped grandchildren included.
Containers are created, not run with auto-remove (that races the exit status and
the output): `release` removes them. Each carries the daemon's id as a label, so
`cleanup_stale` removes what a crashed predecessor left, and this daemon process's
instance, by which its guard (dockerguard.py) removes them if the process dies.

`mode="warm"` runs a run's calls as execs in one long-lived container instead
(docker_warm.py). A long-lived server (`Launch.serve`, an MCP server) always gets a
container of its own, in either mode, in the launch's image if it names one: its
stdin and stdout are asyncio streams over two attach connections (docker_io.py).
dockerd itself is only spoken to in dockerd.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import secrets
import signal
from pathlib import Path
from typing import Any, TypeVar

from .base import Captured, Exit, Launch, Probe, SandboxError
from .docker_io import ServerStdio, Stdio
from .docker_warm import ExecRunning, WarmPool
from .dockerd import Dockerd, exit_of, in_thread
from .dockerguard import Guard
from .pidwatch import PidWatch
from .stopping import off_loop

log = logging.getLogger("execgate.sandbox")

MODES = ("per-call", "warm")


class DockerSandbox:
    name = "docker"
    # The workspace read-only, the declared write paths mounted read-write over it.
    confines_writes = True

    def __init__(self, image: str, *, daemon_id: str, mode: str = "per-call") -> None:
        if mode not in MODES:
            raise ValueError(f"docker mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.image = image
        self.mode = mode
        instance = secrets.token_hex(8)
        # Started before this daemon's first container starts (see dockerguard.py).
        self.guard = Guard(daemon_id, instance)
        self.dockerd = Dockerd(image, daemon_id, instance=instance, on_create=self.guard.ensure)
        self._warm = WarmPool(self.dockerd)

    async def start(self, launch: Launch) -> ContainerRunning | ExecRunning:
        if launch.serve:
            return await self._serve(launch)
        if self.mode == "warm":
            return await self._warm.start(launch)
        cid, sio = await asyncio.to_thread(self.dockerd.start_attached, launch)
        io = Stdio(sio, launch.stdin, launch.output_cap)
        return await self._watched(
            ContainerRunning(self.dockerd, cid, io, self._where(cid, launch))
        )

    async def _serve(self, launch: Launch) -> ServingContainer:
        cid, stdin, output = await asyncio.to_thread(self.dockerd.start_serving, launch)
        try:
            io = await ServerStdio.open(stdin, output, launch.output_cap)
        except BaseException:
            await asyncio.to_thread(self.dockerd.remove, cid)
            raise
        return await self._watched(
            ServingContainer(self.dockerd, cid, io, self._where(cid, launch))
        )

    def _where(self, cid: str, launch: Launch) -> str:
        return f"container {cid[:12]} ({launch.image or self.image})"

    async def _watched(self, running: R) -> R:
        """`running` with its container's init watched, where this daemon can see it."""
        try:
            pid = await asyncio.to_thread(self.dockerd.init_pid, running.cid)
        except SandboxError:
            pid = 0
        if pid and _in_container(pid, running.cid):
            running.watch = PidWatch(pid)
        return running

    def probe(self) -> Probe:
        try:
            detail = self.dockerd.check()
        except SandboxError as exc:
            return Probe(self.name, False, str(exc))
        if self.mode == "warm" and os.geteuid() != 0:
            why = "warm mode finds a call's processes in /proc: run the daemon as root"
            return Probe(self.name, False, f"{detail}, but {why} (or use per-call mode)")
        return Probe(self.name, True, f"{detail}, {self.mode} mode")

    async def cleanup_stale(self) -> int:
        return await asyncio.to_thread(self.dockerd.remove_labelled)

    def run_ended(self, run_id: str) -> None:
        """The run's warm containers go once their last call ends."""
        self._warm.run_ended(run_id)

    async def close(self) -> None:
        """Remove the warm containers, and any call's container a cancelled start left;
        the guard then quits (it sweeps instead if they could not be removed)."""
        self._warm.forget()
        swept = True
        if self.dockerd.connected:  # else this daemon made no container
            try:
                await asyncio.to_thread(self.dockerd.remove_labelled)
            except SandboxError as exc:  # the guard, else the next start, removes them
                log.warning("docker: containers left at shutdown: %s", exc)
                swept = False
            finally:
                self.dockerd.close()
        await asyncio.to_thread(self.guard.close, swept=swept)


class ContainerRunning:
    """A call in a container of its own."""

    def __init__(
        self, dockerd: Dockerd, cid: str, io: Stdio | ServerStdio, description: str
    ) -> None:
        self.dockerd = dockerd
        self.cid = cid
        self.io = io
        self.description = description
        # Set before we signal: a status above 128 then means "killed by that signal".
        self._signalled = False
        # SIGKILL went to its init through a pidfd: once the init is gone, so is it all.
        self._killed = False
        self._released = False
        self._terms: list[asyncio.Future[None]] = []
        self._exited = in_thread(self._wait_exit, f"docker-wait-{cid[:12]}")
        # The container's init, where this daemon can see it (same PID namespace).
        self.watch: PidWatch | None = None

    def _wait_exit(self) -> Exit:
        code, oom = self.dockerd.wait(self.cid)
        return exit_of(code, oom, self._signalled)

    async def wait(self) -> Exit:
        watch = self.watch
        if watch is not None and not self._exited.done():
            ended = asyncio.ensure_future(watch.ended.wait())
            either: set[asyncio.Future[Any]] = {self._exited, ended}
            try:
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ended.cancel()
            if self._killed and watch.gone_at is not None and not self._exited.done():
                # We killed its init and it is gone: dockerd's report of it (its event
                # path: tens of ms, hundreds on a busy host) adds nothing to know.
                return Exit(None, int(signal.SIGKILL), at=watch.gone_at)
        ended_exit = await asyncio.shield(self._exited)
        if watch is not None and watch.gone_at is not None:
            # dockerd reports the exit tens of ms after the init is gone; with it gone
            # the kernel has emptied the container's PID namespace.
            return dataclasses.replace(ended_exit, at=watch.gone_at)
        return ended_exit

    async def finish(self) -> None:
        """Nothing is left: docker-init exits with the command, and the kernel empties
        the container's PID namespace once its init is gone."""

    async def terminate(self) -> str:
        # `docker kill` takes 2-70 ms here: too long to block the event loop on, so it
        # runs in a thread, which `release` joins.
        self._signalled = True
        if self.watch is not None and self.watch.send(signal.SIGTERM):
            return f"SIGTERM to container {self.cid[:12]}'s init (it forwards it to the command)"
        send = functools.partial(self.dockerd.signal, self.cid, "SIGTERM")
        self._terms.append(in_thread(send, "docker-sigterm"))
        return f"SIGTERM to container {self.cid[:12]} (docker-init forwards it to the command)"

    async def kill(self) -> str:
        self._signalled = True
        if self.watch is not None and self.watch.send(signal.SIGKILL):
            self._killed = True
            return f"SIGKILL to container {self.cid[:12]}'s init (its PID namespace dies with it)"
        await off_loop(self.dockerd.signal, self.cid, "SIGKILL")
        return f"SIGKILL to container {self.cid[:12]} (its whole PID namespace dies with it)"

    async def survivors(self) -> list[int]:
        if self._exited.done() and self._exited.exception() is None:
            return []  # its init is gone, and so is everything else in it
        if self.watch is not None and self.watch.gone_at is not None:
            return []  # the same, seen through its pidfd before dockerd says so
        return await off_loop(self.dockerd.top, self.cid)

    async def output(self) -> tuple[Captured, Captured]:
        return await self.io.result()

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self.watch is not None:
            self.watch.close()
        # A SIGTERM that failed changes nothing now: the ladder has gone on without it.
        await asyncio.gather(*self._terms, return_exceptions=True)
        try:
            await asyncio.to_thread(self.dockerd.remove, self.cid)
        finally:
            self.io.close()


class ServingContainer(ContainerRunning):
    """A long-lived server in a container of its own (`Launch.serve`; base.Serving).

    Its stdin closes when the caller closes it or this daemon's connection drops
    (StdinOnce); `kill` is the container's, so every process of the server goes.
    """

    io: ServerStdio

    def stdio(self) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
        return self.io.stdin, self.io.stdout


R = TypeVar("R", bound=ContainerRunning)


def _in_container(pid: int, cid: str) -> bool:
    """Is host pid `pid` (as dockerd reports it) that container's process here too?

    Not when this daemon runs in a PID namespace of its own (in a container itself):
    the number then names some other process, or none.
    """
    try:
        return cid in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
