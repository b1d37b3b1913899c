"""The `bwrap` backend: bubblewrap namespaces around the process backend's limits.

New PID, IPC, UTS and (unless policy allows the network) network namespaces; the
system directories read-only; a private /tmp and /dev/shm (the root and /dev
themselves read-only, as in a warm sandbox); the workspace bound read-write for
a tool that may write and read-only otherwise (a command that declared its writes:
read-only, with each declared path bound read-write over it, from a descriptor
opened beneath the workspace root with no symlink followed); nothing else of the host visible
(home directories, /root, /var, other projects); all capabilities dropped; the
environment cleared; `--die-with-parent`, so the sandbox dies with the daemon.

Stopping: the polite SIGTERM goes to every process in the call's PID namespace
but its init; force kills the namespace's init, upon which the kernel kills
every process in the namespace -- setsid-escaped and double-forked grandchildren
included, since nothing can leave a PID namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import select
import shutil
import signal
import subprocess
from pathlib import Path

from execgate.executor.core import beneath

from . import procscan
from .base import MARKER_ENV, Exit, Launch, Probe, SandboxError
from .cgroup import CgroupRoot
from .process import HostRunning, ProcessSandbox
from .spawn import Pipes, launcher, spawn
from .stopping import off_loop

BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
# How often a SIGTERM that arrived before the command existed looks for it.
OWED_POLL_SECONDS = 0.003
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc a program needs to run: users, name service, the loader's cache,
# the time zone, Debian's alternatives (awk, editor, ...). Each is a bind mount,
# and a mount costs a sandbox start about 0.15 ms: the list is short on purpose.
ETC_ENTRIES = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "localtime", "alternatives")
# Only where policy opens the network: resolving names and TLS roots.
ETC_NETWORK = ("hosts", "resolv.conf", "ssl", "ca-certificates")


def system_binds(*, network: bool = False) -> list[str]:
    return list(_system_binds(network))


@functools.lru_cache(maxsize=16)
def _system_binds(network: bool) -> tuple[str, ...]:
    """Looked up once per daemon (about 20 stat calls): the host's layout does not move."""
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for name in ETC_ENTRIES + (ETC_NETWORK if network else ()):
        path = f"/etc/{name}"
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return tuple(args)


def bwrap_argv(
    launch: Launch,
    extra_ro: tuple[Path, ...] = (),
    env_fd: int | None = None,
    write_fds: tuple[int, ...] = (),
) -> list[str]:
    """bwrap's command line. With `env_fd`, the environment is read from that descriptor
    (see `env_args`) instead of being spelled on a command line any local user can read.
    `write_fds`: descriptors of `launch.write_paths` (`open_writes`), bound read-write
    where they are, over the read-only workspace."""
    conf = launch.confinement
    args = [BWRAP, "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not conf.network:
        args.append("--unshare-net")
    if os.geteuid() != 0:
        args.append("--unshare-user")
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"]
    args += system_binds(network=conf.network)
    # The new /proc, but its /proc/sys read-only: a root daemon's commands run as uid 0
    # (without capabilities), and uid 0 may write many host-wide sysctls.
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    # /dev read-only but for its own /dev/shm (a warm sandbox's calls share its /dev).
    args += ["--dev", "/dev", "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--tmpfs", "/tmp"]
    # After the private /tmp: an extra read-only path under /tmp (a venv, a server's
    # install) stays visible instead of being hidden by the tmpfs.
    for extra in extra_ro:
        args += ["--ro-bind", str(extra), str(extra)]
    ws = str(launch.workspace)
    args += ["--bind" if launch.writable else "--ro-bind", ws, ws]
    # Parents first: a path bound after one inside it would hide that mount.
    for fd, path in sorted(zip(write_fds, launch.write_paths, strict=True), key=_depth):
        args += ["--bind-fd", str(fd), str(path)]
    # The root (bwrap's scratch tmpfs of mount points) read-only, last: a warm call's is.
    args += ["--remount-ro", "/", "--chdir", str(launch.cwd)]
    if env_fd is not None:
        args += ["--args", str(env_fd)]
    else:
        args += env_args(launch).decode().split("\0")[:-1]
    return [*args, "--", *launch.argv]


def _depth(bound: tuple[int, Path]) -> int:
    return len(bound[1].parts)


def open_writes(launch: Launch) -> tuple[int, ...]:
    """An O_PATH descriptor of each declared write path, opened beneath the workspace
    root with no symlink anywhere: a path swapped for a symlink since it was checked is
    refused (SandboxError), never bound."""
    root = os.open(launch.workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    fds: list[int] = []
    try:
        for path in launch.write_paths:
            rel = os.path.relpath(path, launch.workspace)
            fds.append(beneath.open_beneath(root, "" if rel == "." else rel, os.O_PATH))
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        raise SandboxError(f"declared write path {exc.filename or ''}: {exc.strerror}") from exc
    finally:
        os.close(root)
    return tuple(fds)


def env_args(launch: Launch) -> bytes:
    """`--clearenv --setenv NAME VALUE ...`, NUL-separated, as bwrap's `--args` reads them."""
    args = ["--clearenv"]
    for name, value in {**launch.env, MARKER_ENV: launch.marker}.items():
        args += ["--setenv", name, value]
    return b"".join(a.encode() + b"\0" for a in args)


def env_fd(launch: Launch) -> int:
    """A memfd holding `env_args`, positioned at its start."""
    fd = os.memfd_create("execgate-env", os.MFD_CLOEXEC)
    os.write(fd, env_args(launch))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@functools.lru_cache(maxsize=1)
def _system_roots() -> tuple[str, ...]:
    return tuple(os.path.realpath(d) for d in SYSTEM_DIRS if os.path.exists(d))


class BwrapRunning(HostRunning):
    _ns_init: int | None = None
    _ns: str | None = None
    # A SIGTERM asked for before the command existed, being delivered.
    _owed: asyncio.Future[None] | None = None
    # A pidfd of the namespace's init, once it is known.
    _init_fd: int | None = None

    async def wait(self) -> Exit:
        # bwrap reports a command killed by signal N as exit status 128 + N (the
        # shell's convention; a command that itself exits 129..192 reads the same).
        ended = await super().wait()
        if ended.code is not None and 128 < ended.code <= 128 + 64:
            return Exit(None, ended.code - 128, ended.oom_killed, ended.at)
        return ended

    async def _namespace(self) -> tuple[int, str] | None:
        """The namespace's init (bwrap's child) and its namespace id, once they exist."""
        for _ in range(100):
            if self._ns is None:
                self._resolve_now()
            if self._ns_init is not None and self._ns is not None:
                return self._ns_init, self._ns
            if not self.watch.alive():
                return None
            await asyncio.sleep(0.002)
        return None

    async def finish(self) -> None:
        # bwrap exits after the namespace's init, and the kernel empties a namespace
        # before its init is gone: only the cgroup (if any) can still hold something.
        if self.group is not None and self.group.procs():
            await off_loop(self.group.kill)

    async def terminate(self) -> str:
        sent = await off_loop(self._signal_members, signal.SIGTERM)
        if sent:
            return f"SIGTERM to {sent} process(es) in {self._ns}"
        # bwrap is still building the sandbox: the command does not exist yet. The
        # signal is owed, and goes to the command's processes as soon as they appear.
        if self._owed is None:
            self._owed = asyncio.ensure_future(self._deliver_owed())
        return "SIGTERM owed: the sandbox is still being built; sent once the command starts"

    def _signal_members(self, sig: int) -> int:
        """Signal every process in the namespace but its init; how many there were."""
        if self._ns is None:
            self._resolve_now()
        if self._ns is None or self._ns_init is None:
            return 0
        if self.group is not None:
            # The leaf holds exactly bwrap, the init and the call's processes: no /proc
            # scan (tens of milliseconds on a busy host, where every stop waits for it).
            outside = {self.proc.pid, self._ns_init}
            members = sorted(self.group.procs() - outside)
        else:
            members = [p for p in procscan.in_namespace(self._ns) if p != self._ns_init]
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return len(members)

    async def _deliver_owed(self) -> None:
        # Nothing announces a process entering the namespace: /proc is polled.
        while self.watch.alive():
            if await off_loop(self._signal_members, signal.SIGTERM):
                return
            await asyncio.sleep(OWED_POLL_SECONDS)

    def _forget_owed(self) -> None:
        if self._owed is not None:
            self._owed.cancel()

    def _resolve_now(self) -> None:
        kids = procscan.children(self.proc.pid)
        ns = procscan.pid_namespace(kids[0]) if kids else None
        if ns is not None and ns != procscan.pid_namespace(self.proc.pid):
            with contextlib.suppress(OSError):
                # Signals to the init go through a pidfd: never to a recycled pid.
                self._init_fd = os.pidfd_open(kids[0])
                self._ns_init, self._ns = kids[0], ns

    async def kill(self) -> str:
        self._forget_owed()
        found = await self._namespace()
        if found is None:  # bwrap is gone or never built the namespace
            return await super().kill()
        _, ns = found
        if self._init_fd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._init_fd, signal.SIGKILL)
        how = f"SIGKILL to the init of {ns} (the kernel kills the whole namespace)"
        if self.group is not None:
            how += "; " + await off_loop(self.group.kill)
        return how

    async def release(self) -> None:
        self._forget_owed()
        if self._init_fd is not None:
            fd, self._init_fd = self._init_fd, None
            os.close(fd)
        await super().release()

    async def survivors(self) -> list[int]:
        if self._init_gone():
            # The kernel empties a namespace before its init is gone; what is left to
            # look at is the leaf (bwrap itself, on its way out).
            group = self.group
            if group is None:
                return []
            return await off_loop(lambda: sorted(p for p in group.procs() if procscan.alive(p)))
        found = set(await super().survivors())
        if self._ns is not None:
            found |= set(await off_loop(procscan.in_namespace, self._ns))
        return sorted(found)

    def _init_gone(self) -> bool:
        """The namespace's init is known and has exited (its pidfd is readable)."""
        if self._init_fd is None:
            return False
        readable, _, _ = select.select([self._init_fd], [], [], 0)
        return bool(readable)


class BwrapSandbox(ProcessSandbox):
    name = "bwrap"
    # Killing the namespace's init ends every process of the call.
    needs_cgroup_kill = False
    # The workspace read-only, the declared write paths bound read-write over it.
    confines_writes = True

    def __init__(self, cgroups: CgroupRoot | None = None, extra_ro: tuple[Path, ...] = ()) -> None:
        super().__init__(cgroups)
        self.extra_ro = extra_ro

    async def start(self, launch: Launch) -> BwrapRunning:
        group = await asyncio.to_thread(self._prepare, launch, self._visible(launch))
        opened: list[int] = []
        try:
            # A few openat(2) calls, no thread hop: nothing can be lost between them.
            writes = open_writes(launch) if launch.write_paths else ()
            opened += writes
            fd = env_fd(launch)
            opened.append(fd)
            argv = [
                *launcher(launch.confinement, group),
                *bwrap_argv(launch, self.extra_ro, fd, writes),
            ]
            proc = await spawn(
                argv,
                cwd=launch.cwd,
                env={},
                stdin=launch.stdin,
                pass_fds=tuple(opened),
                serve=launch.serve,
            )
        except BaseException:
            if group is not None:
                await asyncio.to_thread(group.remove)
            raise
        finally:
            for each in opened:
                os.close(each)
        pipes = Pipes(proc, launch.stdin, launch.output_cap, serve=launch.serve)
        where = f"bwrap {proc.pid}" + (f", cgroup {group.dirs[0].name}" if group else "")
        return BwrapRunning(proc, pipes, group, launch.marker, where)

    def _visible(self, launch: Launch) -> tuple[str, ...]:
        """The host paths the sandbox shows where they are on the host."""
        return (*_system_roots(), str(launch.workspace), *(str(p) for p in self.extra_ro))

    def probe(self) -> Probe:
        if not os.access(BWRAP, os.X_OK):
            return Probe(self.name, False, "bubblewrap is not installed (apt install bubblewrap)")
        argv = [BWRAP, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        if os.geteuid() != 0:
            argv.append("--unshare-user")
        argv += ["--die-with-parent", *system_binds(), "--proc", "/proc", "--", "true"]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(self.name, False, f"bwrap does not run: {exc}")
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip()
            return Probe(self.name, False, f"bwrap fails here: {why}")
        tree = self.cgroups.describe() if self.cgroups else "cgroups not used"
        return Probe(self.name, True, f"pid/net/ipc/uts namespaces, caps dropped; {tree}")
