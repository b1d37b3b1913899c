"""A warm bwrap sandbox: built once per run, its calls run in hosts kept ready.

A warm sandbox is one bwrap -- the same namespaces, binds and dropped capabilities
as a cold call's, built once -- whose PID 1 is the supervisor (supervisor.py). It is
shared by the calls of one run, workspace and network setting (the key). Each call
still gets what a cold call gets, built per call by a host the supervisor forked:
its own PID, mount and IPC namespaces, a private /tmp and /dev/shm, its own /proc,
its view of the workspace (read-write, read-only, or read-only but for its
declared write paths), its own cgroup leaves, rlimits and environment, no
capabilities, no new privileges, the same uid (warm_call.py). A host serves one
call at a time and is given back after a call that ended by itself (everything of
it killed and reaped, its mounts reset); one that was force-killed is gone, and
the supervisor forks another.

A sandbox dies with the daemon: `--die-with-parent`, and the supervisor is its
namespace's init, so a SIGKILLed daemon leaves nothing of it. One whose supervisor
died (its control socket ends) is `dead`: its calls died with its namespace, and
the pool (warm_pool.py) builds a new one for the next call.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import warmproto
from .base import SandboxError
from .bwrap import BWRAP, system_binds
from .warm_leaves import Leaves

# Hosts forked ahead when a sandbox is built, and kept when their calls end.
FIRST_HOSTS = 2
MAX_IDLE_HOSTS = 8
BUILD_SECONDS = 30.0
REAP_SECONDS = 5.0
# Where the supervisor and the interpreter it runs on are bound, under the sandbox's
# own /tmp: every host's fresh /tmp hides them.
HIDDEN = "/tmp/.execgate"
_SUPERVISOR_FILES = ("supervisor.py", "nsops.py", "warmproto.py")
# The supervisor's capabilities, and no other (CAP_SYS_ADMIN: namespaces and mounts;
# CAP_NET_ADMIN: a call's network namespace's loopback; CAP_SETPCAP: emptying the
# bounding set, so that nothing exec'd gets any).
_CAPS = ("CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SETPCAP")

Key = tuple[str, str, bool]  # run, workspace, network
# A host's rlimits (name, value), sorted: it serves only calls with these.
Limits = tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Host:
    """A forked call host: its pid (in the sandbox), a pidfd of it, the socket its
    calls' requests and reports go through, and the rlimits its calls get."""

    pid: int
    pidfd: int
    sock: socket.socket
    limits: Limits


@dataclass(frozen=True, slots=True)
class Interpreter:
    """How the sandbox runs the daemon's Python: the argv head, its environment, and
    the host paths bound (read-only) for it."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    binds: tuple[tuple[str, str], ...]


def interpreter(visible: tuple[str, ...]) -> Interpreter | None:
    """This daemon's interpreter as the sandbox will see it; None if it cannot."""
    exe = os.path.realpath(sys.executable)
    base = os.path.realpath(sys.base_prefix)
    if _under(exe, visible) and _under(base, visible):
        return Interpreter((exe,), (), ())
    if not _under(exe, (base,)):
        return None
    inside = f"{HIDDEN}/python"
    env = (("PYTHONHOME", inside), ("LD_LIBRARY_PATH", f"{inside}/lib"))
    return Interpreter((inside + exe[len(base) :],), env, ((base, inside),))


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def bwrap_argv(key: Key, python: Interpreter, extra_ro: tuple[Path, ...], ctrl: int) -> list[str]:
    """The sandbox's bwrap: what a cold call's gets, the supervisor as its init."""
    _, workspace, network = key
    args = [BWRAP, "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not network:
        args.append("--unshare-net")
    if os.geteuid() != 0:
        args.append("--unshare-user")
    args += ["--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox"]
    args += ["--cap-drop", "ALL"]
    for cap in _CAPS:
        args += ["--cap-add", cap]
    args += system_binds(network=network)
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    # Each host mounts its own /dev/shm (and /tmp, /proc) over these.
    args += ["--dev", "/dev", "--remount-ro", "/dev", "--tmpfs", "/tmp"]
    for extra in extra_ro:
        args += ["--ro-bind", str(extra), str(extra)]
    args += ["--bind", workspace, workspace]
    for source, inside in python.binds:
        args += ["--ro-bind", source, inside]
    here = Path(__file__).parent
    for name in _SUPERVISOR_FILES:
        args += ["--ro-bind", str(here / name), f"{HIDDEN}/sup/{name}"]
    args += ["--remount-ro", "/", "--chdir", "/", "--clearenv"]
    for name, value in python.env:
        args += ["--setenv", name, value]
    tmp_ro = [str(p) for p in extra_ro if _under(str(p), ("/tmp",))]
    config = json.dumps({"workspace": workspace, "tmp_ro": tmp_ro, "private_net": not network})
    script = f"{HIDDEN}/sup/supervisor.py"
    return [*args, "--", *python.argv, "-S", "-s", "-B", script, str(ctrl), config]


class WarmBox:
    """One warm sandbox: its bwrap, the supervisor's control socket, idle hosts.

    Invariants: `dead` is set once the control socket has ended or the box was closed;
    a dead box lends no host, and every waiter for one has been failed. `_asked` hosts
    were asked of the supervisor and have not come yet (it answers in order).
    """

    def __init__(
        self, key: Key, proc: asyncio.subprocess.Process, ctrl: socket.socket, leaves: Leaves
    ) -> None:
        # Set once more when a box built ahead is given to a run (warm_pool.py).
        self.key = key
        self.proc = proc
        self.ctrl = ctrl
        self.leaves = leaves
        # (st_dev, st_ino) of the workspace bound: a workspace replaced since is not it.
        self.identity = _identity(key[1])
        self.users = 0
        self.idle_since = time.monotonic()
        self.dead = False
        # Closed when its last call leaves (its run ended, or the pool needed room).
        self.doomed = False
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._idle: dict[Limits, collections.deque[Host]] = {}
        self._waiters: dict[Limits, collections.deque[asyncio.Future[Host]]] = {}
        # The limits of each host asked for and not come yet, in order.
        self._asked: collections.deque[Limits] = collections.deque()
        loop.add_reader(ctrl.fileno(), self._on_ctrl)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def enter(self) -> None:
        self.users += 1

    def leave(self) -> None:
        self.users -= 1
        self.idle_since = time.monotonic()
        if self.doomed and self.users == 0:
            self.close()

    def doom(self) -> None:
        """Lend nothing more; close once no call is in it."""
        self.doomed = True
        if self.users == 0:
            self.close()

    async def take(self, limits: Limits) -> Host:
        """An idle host with `limits`, or a new one (and one more asked for when none
        is left idle, so that the next call finds one)."""
        if self.dead:
            raise SandboxError("the warm sandbox is gone")
        idle = self._idle.get(limits)
        if idle:
            host = idle.popleft()
            if not idle and limits not in self._asked:
                self.ask(limits)
            return host
        waiter: asyncio.Future[Host] = asyncio.get_running_loop().create_future()
        waiting = self._waiters.setdefault(limits, collections.deque())
        waiting.append(waiter)
        if self._asked.count(limits) < len(waiting):
            self.ask(limits)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), BUILD_SECONDS)
        except BaseException as exc:
            if waiter in waiting:
                waiting.remove(waiter)
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.give_back(waiter.result())  # it came as we gave up
            waiter.cancel()
            if isinstance(exc, TimeoutError):
                raise SandboxError("the warm sandbox's supervisor forks no host") from exc
            raise

    def give_back(self, host: Host) -> None:
        """A host whose call is over and whose namespace is empty again."""
        waiting = self._waiters.get(host.limits)
        while waiting and not self.dead:
            waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(host)
                return
        idle = self._idle.setdefault(host.limits, collections.deque())
        if self.dead or self.doomed or len(idle) >= MAX_IDLE_HOSTS:
            discard(host)
        else:
            idle.append(host)

    def ask(self, limits: Limits, count: int = 1) -> None:
        """Have the supervisor fork `count` more hosts with `limits`, each parked in the
        pool's park leaves between calls."""
        for _ in range(count):
            park = self.leaves.park()
            try:
                warmproto.send(self.ctrl, {"op": "host", "limits": dict(limits)}, park)
            except OSError:
                self._died()
                return
            finally:
                for fd in park:
                    os.close(fd)
            self._asked.append(limits)

    def _on_ctrl(self) -> None:
        while not self.dead:
            try:
                got = warmproto.receive(self.ctrl)
            except BlockingIOError:
                return
            except (OSError, ValueError):
                got = None
            if got is None:
                self._died()
                return
            self._handle(*got)

    def _handle(self, message: dict[str, object], fds: list[int]) -> None:
        if message.get("op") == "ready" and not self.ready.done():
            self.ready.set_result(None)
        if message.get("op") != "host" or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return
        limits = self._asked.popleft()
        sock = socket.socket(fileno=fds[1])
        sock.setblocking(False)
        self.give_back(Host(int(str(message["pid"])), fds[0], sock, limits))

    def _died(self) -> None:
        if self.dead:
            return
        self.dead = True
        with contextlib.suppress(ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(self.ctrl.fileno())
        self.ctrl.close()
        gone = SandboxError("the warm sandbox's supervisor is gone")
        if not self.ready.done():
            self.ready.set_exception(gone)
        for waiting in self._waiters.values():
            for waiter in waiting:
                if not waiter.done():
                    waiter.set_exception(gone)
        self._waiters.clear()
        for idle in self._idle.values():
            for host in idle:
                discard(host)
        self._idle.clear()

    def close(self) -> None:
        """End the sandbox: the supervisor sees its control socket end and exits, and
        the kernel kills its namespace (calls still in it included)."""
        self._died()

    def stale(self) -> bool:
        return self.dead or _identity(self.key[1]) != self.identity

    async def reap(self) -> None:
        """After `close`: until bwrap has exited (killed if it takes REAP_SECONDS)."""
        try:
            await asyncio.wait_for(self.proc.wait(), REAP_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


def discard(host: Host) -> None:
    """Let a host go: closing its socket ends it (if it still runs)."""
    host.sock.close()
    with contextlib.suppress(OSError):
        os.close(host.pidfd)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


async def build(
    key: Key, python: Interpreter, extra_ro: tuple[Path, ...], leaves: Leaves, limits: Limits
) -> WarmBox:
    """Start a warm sandbox for `key` and wait until its supervisor serves; hosts with
    `limits` (its first call's) are asked for at once."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    argv = bwrap_argv(key, python, extra_ro, theirs.fileno())
    try:
        # From the event loop's thread: bwrap's parent-death signal follows the thread
        # that forked it, and this one lives as long as the daemon.
        proc = await asyncio.create_subprocess_exec(
            *argv,
            pass_fds=(theirs.fileno(),),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=None,  # the supervisor's complaints go to the daemon's log
            start_new_session=True,
        )
    except OSError as exc:
        ours.close()
        raise SandboxError(f"cannot start {BWRAP}: {exc.strerror}") from exc
    finally:
        theirs.close()
    box = WarmBox(key, proc, ours, leaves)
    try:
        await asyncio.wait_for(asyncio.shield(box.ready), BUILD_SECONDS)
    except BaseException as exc:
        box.close()
        await box.reap()
        if isinstance(exc, TimeoutError):
            raise SandboxError(
                f"the warm sandbox's supervisor did not start in {BUILD_SECONDS:g}s"
            ) from exc
        raise
    box.ask(limits, FIRST_HOSTS)
    return box
