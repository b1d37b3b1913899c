"""The `process` backend: own session and process group, rlimits, cgroup leaves where allowed.

Weakest of the three: no namespaces, so the command sees the host file system
and the network (path confinement is the tools' own). It never holds root's
powers (privileges.py): under a root daemon it runs as an unprivileged user, and
always with no-new-privileges and no capabilities.

Force termination kills the process group, then the cgroup leaf (which also
holds setsid-escaped grandchildren), then sweeps /proc for the call's marker --
a process that both left the session and cleared its environment on a host
without usable cgroups is the one thing this backend cannot find.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal

from . import procscan
from .base import MARKER_ENV, Captured, Exit, Launch, Probe, SandboxError
from .cgroup import CallCgroup, CgroupRoot
from .pidwatch import PidWatch
from .privileges import Privileges
from .spawn import DASH, PRLIMIT, Pipes, launcher, spawn
from .stopping import off_loop

# After the call stops, a process that escaped every sweep may still hold the output
# pipes open: read what is there, then stop waiting.
OUTPUT_SETTLE_SECONDS = 1.0


class ProgramNotFound(SandboxError):
    """`program` is not where the call's PATH (or its path) says, as the sandbox shows it."""

    def __init__(self, program: str) -> None:
        super().__init__(f"program not found: {program}")
        self.program = program


class ProgramNotExecutable(SandboxError):
    """`program` exists but is not an executable file."""

    def __init__(self, program: str) -> None:
        super().__init__(f"cannot execute {program}")
        self.program = program


def find_program(name: str, launch: Launch, visible: tuple[str, ...] = ("/",)) -> None:
    """Check the program exists and may be executed, before any sandbox is built.

    Looked up on the host, with the call's PATH, among the host paths the sandbox
    shows at the same place (`visible`): what the sandbox hides is "not found",
    so the answer tells nothing about the host beyond the sandbox.
    """
    if "/" not in name:
        dirs = launch.env.get("PATH", os.defpath).split(os.pathsep)
        shown = os.pathsep.join(d for d in dirs if _under(d, visible))
        if shutil.which(name, path=shown) is None:
            raise ProgramNotFound(name)
        return
    path = launch.cwd / name
    if not _under(str(path), visible) or not path.exists():
        raise ProgramNotFound(name)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ProgramNotExecutable(name)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    try:
        real = os.path.realpath(path)
    except OSError:  # a component changed while it was resolved: not found
        return False
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


class HostRunning:
    """A call running as a host process tree (the `process` and `bwrap` backends).

    The main process is watched through a pidfd: its exit is seen at once (asyncio's
    `Process.wait` also waits for the output pipes, which a background child may
    hold open), and the process group is signalled only while its leader has not
    exited -- a group whose leader is gone may be empty, and its id reused.
    """

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        pipes: Pipes,
        group: CallCgroup | None,
        marker: str,
        description: str,
    ) -> None:
        self.proc = proc
        self.pipes = pipes
        self.group = group
        self.marker = marker
        self.description = description
        self.watch = PidWatch(proc.pid)

    async def wait(self) -> Exit:
        if self.watch.watching:
            await self.watch.ended.wait()
            code = await self._returncode()
        else:  # no pidfds on this kernel
            code = await self.proc.wait()
        oom = self.group.oom_killed() if self.group is not None else False
        # Seen to end when its pidfd said so: asyncio's child watcher (a thread) reaps it
        # and tells the loop a while later on a busy host.
        at = self.watch.gone_at
        return Exit(code, None, oom, at) if code >= 0 else Exit(None, -code, oom, at)

    async def _returncode(self) -> int:
        """The status asyncio's child watcher reaped (it is there within a moment)."""
        spins = 0
        while self.proc.returncode is None:
            # The watcher's thread posts it to this loop: usually a few turns away.
            spins += 1
            await asyncio.sleep(0 if spins < 100 else 0.001)
        return self.proc.returncode

    async def finish(self) -> None:
        if self.group is not None:
            if self.group.procs():
                await off_loop(self.group.kill)
        else:
            await off_loop(self._sweep, signal.SIGKILL)

    async def terminate(self) -> str:
        if self._signal_group(signal.SIGTERM):
            return f"SIGTERM to process group {self.proc.pid}"
        count = await off_loop(self._sweep, signal.SIGTERM)
        return f"SIGTERM to {count} process(es) the call left (its main process had exited)"

    async def kill(self) -> str:
        how = []
        if self._signal_group(signal.SIGKILL):
            how.append(f"SIGKILL to process group {self.proc.pid}")
        if self.group is not None:
            how.append(await off_loop(self.group.kill))
        swept = await off_loop(self._sweep, signal.SIGKILL)
        if swept:
            how.append(f"SIGKILL to {swept} marked process(es)")
        return "; ".join(how) or "nothing left to kill"

    def _signal_group(self, sig: int) -> bool:
        if not self.watch.alive():
            return False
        _killpg(self.proc.pid, sig)
        return True

    def _sweep(self, sig: int) -> int:
        pids = procscan.with_marker(MARKER_ENV, self.marker)
        if self.group is not None:
            pids = sorted(set(pids) | self.group.procs())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return len(pids)

    async def survivors(self) -> list[int]:
        def scan() -> list[int]:
            found = set(procscan.with_marker(MARKER_ENV, self.marker))
            if self.group is not None:
                found |= {p for p in self.group.procs() if procscan.alive(p)}
            return sorted(found)

        return await off_loop(scan)

    async def output(self) -> tuple[Captured, Captured]:
        return await self.pipes.result(OUTPUT_SETTLE_SECONDS)

    def stdio(self) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
        """A server's protocol streams (`Launch.serve`; see base.Serving)."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    async def release(self) -> None:
        if self.proc.returncode is None:  # our own task was cancelled mid-call
            self._signal_group(signal.SIGKILL)
        self.watch.close()
        self.pipes.cancel()
        if self.group is not None:
            group, self.group = self.group, None
            if not group.try_remove():  # a killed member is still being reaped
                await asyncio.to_thread(group.remove)


class ProcessSandbox:
    name = "process"
    # The command sees the host's file system: nothing keeps it to declared writes.
    confines_writes = False

    def __init__(
        self, cgroups: CgroupRoot | None = None, privileges: Privileges | None = None
    ) -> None:
        self.cgroups = cgroups
        # What the spawn chain drops before the command (setpriv): never root's powers.
        self.privileges = privileges or Privileges(None)

    async def start(self, launch: Launch) -> HostRunning:
        group = await asyncio.to_thread(self._prepare, launch, ("/",))
        drop = self.privileges.prefix(pdeathsig=launch.serve)
        argv = [*launcher(launch.confinement, group), *drop, *launch.argv]
        env = {**launch.env, MARKER_ENV: launch.marker}
        try:
            proc = await spawn(
                argv, cwd=launch.cwd, env=env, stdin=launch.stdin, serve=launch.serve
            )
        except BaseException:
            if group is not None:
                await asyncio.to_thread(group.remove)
            raise
        where = f"process group {proc.pid}" + (f", cgroup {group.dirs[0].name}" if group else "")
        pipes = Pipes(proc, launch.stdin, launch.output_cap, serve=launch.serve)
        return HostRunning(proc, pipes, group, launch.marker, where)

    # The force kill needs the cgroup (no PID namespace here).
    needs_cgroup_kill = True

    def _prepare(self, launch: Launch, visible: tuple[str, ...]) -> CallCgroup | None:
        """The blocking part of a start (file-system lookups, cgroup writes), in a worker
        thread: many calls starting at once must not hold the event loop."""
        find_program(launch.argv[0], launch, visible)
        return self._leaf(launch)

    def _leaf(self, launch: Launch) -> CallCgroup | None:
        if self.cgroups is None:
            return None
        return self.cgroups.leaf(
            launch.marker, launch.confinement, need_kill=self.needs_cgroup_kill
        )

    def probe(self) -> Probe:
        if DASH is None and not os.access(PRLIMIT, os.X_OK):
            return Probe(self.name, False, "neither dash nor prlimit (util-linux): no rlimits")
        missing = self.privileges.available()
        if missing:
            return Probe(self.name, False, missing)
        how = "dash ulimit" if DASH is not None else "prlimit"
        tree = self.cgroups.describe() if self.cgroups else "cgroups not used"
        return Probe(
            self.name, True, f"session + rlimits ({how}); {tree}; {self.privileges.describe()}"
        )

    async def cleanup_stale(self) -> int:
        return await asyncio.to_thread(self.cgroups.cleanup_stale) if self.cgroups else 0

    async def close(self) -> None:
        return None

    def run_ended(self, run_id: str) -> None:
        """Nothing is kept per run here."""


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
