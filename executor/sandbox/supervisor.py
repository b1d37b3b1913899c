"""The supervisor of a warm bwrap sandbox: forks the hosts its calls run in.

Runs inside the sandbox as its PID 1 (`bwrap --as-pid-1`), on the daemon's own
interpreter with the standard library only (`-S -s`), beside its two modules
(nsops.py, warmproto.py) under the sandbox's /tmp, which every host's own /tmp
hides. It and its hosts are the only processes of the sandbox with capabilities:
CAP_SYS_ADMIN (namespaces, mounts), CAP_NET_ADMIN (a new network namespace's
loopback) and CAP_SETPCAP (to empty the bounding set).

For every `host` the daemon asks for, it forks a process into a new PID namespace
(the host is its init) with its own mount and IPC namespaces: a private copy of
the sandbox's mounts, a fresh /tmp, /dev/shm and /proc, the workspace attached.
The host empties its bounding, inheritable and ambient capability sets and sets
no-new-privileges (nsops.confine_self), so what it execs has no capability, and
then runs the daemon's calls one after another. For a call it gets the call's
stdio, cgroup leaves, rlimits, environment and view of the workspace (read-write,
or read-only but for the declared write paths, each opened beneath the workspace
with no symlink followed); it forks the command (which joins the leaves, takes
its rlimits and a session of its own, and execs) and reports its exit once every
process of the namespace is gone (it SIGKILLs and reaps what the command left).
Before the next call it detaches the write paths, makes the workspace read-write
again, mounts a fresh /tmp and /dev/shm, and enters a fresh IPC namespace and (for
calls without network) a fresh network namespace: nothing of one call is left for
the next.

Stopping: the daemon sends a host SIGUSR1 (it then sends SIGTERM to every
process of its namespace, `kill(-1)`) or SIGKILL (the namespace dies with it;
the daemon asks for a new host), both through a pidfd, so a wedged supervisor
never holds a kill. The threat analysis is in docs/architecture.md ("Warm bwrap
sandboxes").
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import resource
import select
import signal
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # kept out of the sandbox: every module here is copied at each fork
    from typing import Any, NoReturn

if __package__:
    from . import nsops, warmproto
else:  # run as a script inside the sandbox, its two modules beside it
    import nsops  # type: ignore[import-not-found,no-redef]
    import warmproto  # type: ignore[import-not-found,no-redef]

# Parts of /proc a uid-0 command could write host-wide through (bwrap covers the same).
PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")
RLIMITS = {
    "cpu": resource.RLIMIT_CPU,
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
    "as": resource.RLIMIT_AS,
}
# Reset to their defaults in the command: an ignored signal stays ignored across exec,
# and Python ignores SIGPIPE and SIGXFSZ.
DEFAULT_SIGNALS = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
# A cold sandbox's binds are nosuid and nodev too.
HARDENED = nsops.MOUNT_ATTR_NOSUID | nsops.MOUNT_ATTR_NODEV
SCRATCH = nsops.MS_NOSUID | nsops.MS_NODEV


class Config:
    """What the daemon told the supervisor at its start."""

    def __init__(
        self, workspace: str, tmp_ro: tuple[str, ...], private_net: bool, last_cap: int
    ) -> None:
        self.workspace = workspace
        # Read-only host paths under /tmp (--sandbox-ro): re-attached over each fresh /tmp.
        self.tmp_ro = tmp_ro
        # Each call gets a network namespace of its own (only its loopback), as a cold
        # call does; False: the calls share the host's network (the policy opened it).
        self.private_net = private_net
        self.last_cap = last_cap


class Refused(Exception):
    """The call cannot start; `kind` is one of warmproto's refused kinds."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Supervisor:
    def __init__(self, ctrl: socket.socket, config: Config) -> None:
        self.ctrl = ctrl
        self.config = config
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        self.wake_w = wake_w
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select
        self.own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def serve(self) -> int:
        warmproto.send(self.ctrl, {"op": "ready"})
        ctrl = self.ctrl.fileno()
        while True:
            ready, _, _ = select.select([ctrl, self.wake_r], [], [])
            if self.wake_r in ready:
                os.read(self.wake_r, 512)
                self._reap()
            if ctrl in ready:
                got = warmproto.receive(self.ctrl)
                if got is None:  # the daemon closed us: the sandbox ends
                    return 0
                message, fds = got
                try:
                    if message.get("op") == "host":
                        self._host(message["limits"], fds)
                finally:
                    for fd in fds:
                        os.close(fd)

    def _reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def _host(self, limits: dict[str, int], park: list[int]) -> None:
        """Fork a host (with `limits` for all its calls, parked in the `park` leaves
        between them) and hand the daemon a pidfd of it and its end of their socket."""
        theirs, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The host's children get the new namespace; we go back to ours at once.
        nsops.unshare(nsops.CLONE_NEWPID)
        try:
            pid = os.fork()
            if pid == 0:
                self._become_host(mine, theirs, limits, park)
        finally:
            nsops.setns(self.own_pidns, nsops.CLONE_NEWPID)
        mine.close()
        pidfd = os.pidfd_open(pid)
        try:
            warmproto.send(self.ctrl, {"op": "host", "pid": pid}, [pidfd, theirs.fileno()])
        except BrokenPipeError:  # the daemon closed us meanwhile: the loop sees the end
            pass
        finally:
            os.close(pidfd)
            theirs.close()

    def _become_host(
        self, mine: socket.socket, theirs: socket.socket, limits: dict[str, int], park: list[int]
    ) -> NoReturn:
        try:
            signal.set_wakeup_fd(-1)
            for fd in (self.wake_r, self.wake_w, self.own_pidns):
                os.close(fd)
            self.ctrl.close()
            theirs.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGUSR1, _terminate_all)
            Host(self.config, mine, limits, park).serve()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon let us go (its end of our socket is closed)
        except BaseException:
            _complain()
        finally:
            os._exit(0)


def _terminate_all(*_: Any) -> None:
    """The daemon's polite stop: SIGTERM to every process of this namespace but us."""
    with contextlib.suppress(OSError):  # nothing there yet, or already gone
        os.kill(-1, signal.SIGTERM)


class Host:
    """The init of a PID namespace the daemon's calls run in, one after another."""

    def __init__(
        self,
        config: Config,
        sock: socket.socket | None,
        limits: dict[str, int],
        park: list[int],
    ) -> None:
        self.config = config
        self.sock = sock
        # The rlimits of every call it runs: set on itself once, inherited by each
        # command (a lowered hard limit cannot be raised again without a capability).
        self.limits = limits
        # Its cgroup leaves between calls (during one it is in the call's).
        self.park = park
        # Mount points of the current call's write paths, to detach after it.
        self.writes: list[str] = []
        self.read_only = False

    def serve(self) -> None:
        assert self.sock is not None
        try:
            self.prepare()
        except OSError as exc:
            warmproto.send(self.sock, _refusal(warmproto.SETUP, f"sandbox setup: {exc}"))
            return
        while True:
            warmproto.send(self.sock, {"op": "prepared"})
            got = warmproto.receive(self.sock)
            if got is None:  # the daemon let us go
                return
            self.serve_one(*got)
            self.reset()  # an OSError here ends the host: the daemon forks another

    def serve_one(self, message: dict[str, Any], fds: list[int]) -> None:
        assert self.sock is not None
        try:
            child = self.start(message, fds)
        except Refused as exc:
            warmproto.send(self.sock, _refusal(exc.kind, exc.message))
            return
        except OSError as exc:  # the host cannot go on: the daemon forks another
            warmproto.send(self.sock, _refusal(warmproto.SETUP, f"sandbox setup: {exc}"))
            raise
        finally:
            for fd in fds:
                os.close(fd)
        warmproto.send(self.sock, {"op": "started"})
        status = _wait_for(child)
        _kill_the_rest()
        warmproto.send(self.sock, {"op": "exit", **_status(status)})

    def prepare(self) -> None:
        """Parked; namespaces, a fresh /tmp, /dev/shm and /proc, the workspace attached
        (read-write until a call says otherwise); the rlimits; nothing to exec with
        capabilities."""
        for leaf in self.park:
            _join(leaf)
        nsops.unshare(nsops.CLONE_NEWNS | nsops.CLONE_NEWIPC)
        self._own_network()
        nsops.mount(None, "/", None, nsops.MS_REC | nsops.MS_PRIVATE)
        self._scratch(self._held(), first=True)
        nsops.mount("proc", "/proc", "proc", SCRATCH | nsops.MS_NOEXEC)
        for name in PROC_COVERED:
            path = f"/proc/{name}"
            if os.path.exists(path):
                nsops.mount(path, path, None, nsops.MS_BIND | nsops.MS_REC)
                flags = nsops.MS_BIND | nsops.MS_REMOUNT | nsops.MS_RDONLY | SCRATCH
                nsops.mount(None, path, None, flags | nsops.MS_NOEXEC)
        nsops.confine_self(self.config.last_cap)
        for name, value in self.limits.items():
            resource.setrlimit(RLIMITS[name], (value, value))

    def _held(self, *, under_tmp: bool = False) -> list[tuple[str, int]]:
        """Detached copies of what must stay visible over a fresh /tmp: the workspace
        and --sandbox-ro paths (`under_tmp`: only those a fresh /tmp would cover)."""
        clone = nsops.OPEN_TREE_CLONE | nsops.OPEN_TREE_CLOEXEC | nsops.AT_RECURSIVE
        paths = [self.config.workspace, *self.config.tmp_ro]
        if under_tmp:
            paths = [p for p in paths if p == "/tmp" or p.startswith("/tmp/")]
        return [(p, nsops.open_tree(nsops.AT_FDCWD, p, clone)) for p in paths]

    def _scratch(self, held: list[tuple[str, int]], *, first: bool = False) -> None:
        """A fresh /tmp and /dev/shm (the old ones detached), `held` attached again."""
        if not first:
            nsops.umount("/tmp")
            nsops.umount("/dev/shm")
        nsops.mount("tmpfs", "/tmp", "tmpfs", SCRATCH, "mode=0755")
        nsops.mount("tmpfs", "/dev/shm", "tmpfs", SCRATCH, "mode=0755")
        for path, fd in held:
            if path == self.config.workspace:
                nsops.mount_setattr(fd, HARDENED)
            os.makedirs(path, exist_ok=True)  # under the fresh /tmp; elsewhere it is there
            nsops.move_mount(fd, path)
            os.close(fd)

    def start(self, message: dict[str, Any], fds: list[int]) -> int:
        """Give the workspace the call's view, then spawn the command in the call's
        cgroup leaves (we join them for the spawn: the command inherits them)."""
        self._view(message["writable"], message["writes"])
        env: dict[str, str] = message["env"]
        argv: list[str] = message["argv"]
        os.chdir(message["cwd"])
        program = _find(argv[0], env.get("PATH", os.defpath))
        stdin = fds[2] if message["stdin"] else os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        for leaf in fds[3 if message["stdin"] else 2 :]:
            _join(leaf)
        try:
            return _spawn(program, argv, env, (stdin, fds[0], fds[1]))
        finally:
            for leaf in self.park:
                _join(leaf)
            if not message["stdin"]:
                os.close(stdin)

    def _view(self, writable: bool, writes: list[str]) -> None:
        """The workspace as the call may see it: read-write, or read-only but for
        `writes` (each opened beneath the workspace, no symlink followed, and bound
        read-write where it is, as a cold sandbox's --bind-fd does)."""
        ws = self.config.workspace
        root = os.open(ws, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        clones: list[tuple[str, int]] = []
        try:
            for rel in writes:
                clones.append((rel, _clone_beneath(root, rel, ws)))
            if not writable:
                nsops.mount_setattr(root, nsops.MOUNT_ATTR_RDONLY)
                self.read_only = True
        except BaseException:
            for _, fd in clones:
                os.close(fd)
            raise
        finally:
            os.close(root)
        # Parents first: a path bound after one inside it would hide that mount.
        for rel, fd in sorted(clones, key=lambda c: len(c[0].split("/"))):
            target = os.path.normpath(os.path.join(ws, rel))
            nsops.move_mount(fd, target)
            os.close(fd)
            self.writes.append(target)

    def reset(self) -> None:
        """Undo the last call's view; a fresh /tmp, /dev/shm and IPC namespace."""
        for target in reversed(self.writes):
            nsops.umount(target)
        self.writes.clear()
        if self.read_only:
            root = os.open(self.config.workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                nsops.mount_setattr(root, 0, nsops.MOUNT_ATTR_RDONLY)
            finally:
                os.close(root)
            self.read_only = False
        self._scratch(self._held(under_tmp=True))
        nsops.unshare(nsops.CLONE_NEWIPC)
        self._own_network()

    def _own_network(self) -> None:
        """A fresh network namespace with its loopback up (where calls have no network)."""
        if self.config.private_net:
            nsops.unshare(nsops.CLONE_NEWNET)
            nsops.loopback_up()


def _clone_beneath(root: int, rel: str, ws: str) -> int:
    """A detached read-write copy of the mount at `rel` (as the workspace is now)."""
    try:
        fd = nsops.open_beneath(root, rel, os.O_PATH)
    except OSError as exc:
        why = f"declared write path {os.path.join(ws, rel)}: {os.strerror(exc.errno or 0)}"
        raise Refused(warmproto.WRITE_PATH, why) from exc
    try:
        return nsops.clone_tree(fd)
    finally:
        os.close(fd)


def _spawn(program: str, argv: list[str], env: dict[str, str], stdio: tuple[int, ...]) -> int:
    """posix_spawn (a vfork: no copy of our memory) in a session of its own, default
    signal dispositions, the call's stdio. It execs with no capability (see
    nsops.confine_self) and our rlimits."""
    options: dict[str, Any] = {
        "file_actions": [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(stdio)],
        "setsid": True,
        "setsigdef": DEFAULT_SIGNALS,
        "setsigmask": (),
    }
    try:
        try:
            return os.posix_spawn(program, argv, env, **options)
        except OSError as exc:
            if exc.errno != errno.ENOEXEC:
                raise
            # A script without #!, which execvp gives to sh.
            return os.posix_spawn("/bin/sh", ["sh", program, *argv[1:]], env, **options)
    except OSError as exc:
        if exc.errno == errno.EACCES:
            raise Refused(warmproto.NOT_EXECUTABLE, argv[0]) from exc
        raise Refused(warmproto.SPAWN, f"cannot start {program}: {exc.strerror}") from exc


def _kill_the_rest() -> None:
    """The command is gone: SIGKILL whatever it left in the namespace, reap it all. When
    this returns the namespace holds nobody but us (everything in it descends from us)."""
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _join(leaf: int) -> None:
    fd = os.open("cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=leaf)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def _find(name: str, path: str) -> str:
    """The program as execvp would find it, in the call's own view."""
    candidates = [name] if "/" in name else [os.path.join(d or ".", name) for d in path.split(":")]
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    if any(os.path.exists(c) for c in candidates):
        raise Refused(warmproto.NOT_EXECUTABLE, name)
    raise Refused(warmproto.NOT_FOUND, name)


def _wait_for(child: int) -> int:
    """Reap everything (we are the namespace's init) until `child` ends; its status."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            return status


def _status(status: int) -> dict[str, int]:
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"code": os.WEXITSTATUS(status)}


def _complain() -> None:
    """The exception being handled, on stderr (the daemon's log): one line."""
    exc = sys.exc_info()[1]
    sys.stderr.write(f"execgate warm supervisor {os.getpid()}: {type(exc).__name__}: {exc}\n")


def _refusal(kind: str, message: str) -> dict[str, Any]:
    return {"op": "refused", "kind": kind, "message": message}


def selftest(config: Config) -> int:
    """A host's whole path, with `true` for the command twice: does this kernel allow it?"""
    nsops.unshare(nsops.CLONE_NEWPID)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            limits = {"cpu": 10, "fsize": 1 << 20, "nofile": 64, "nproc": 64, "as": 1 << 30}
            host = Host(config, None, limits, [])
            host.prepare()
            os.makedirs(f"{config.workspace}/w")
            for _ in range(2):
                null = os.open("/dev/null", os.O_RDWR)
                message = {
                    "writable": False,
                    "writes": ["w"],
                    "cwd": config.workspace,
                    "env": {"PATH": "/usr/bin:/bin"},
                    "argv": ["true"],
                    "stdin": False,
                }
                code = os.waitstatus_to_exitcode(_wait_for(host.start(message, [null, null])))
                _kill_the_rest()
                os.close(null)
                host.reset()
        except BaseException:
            _complain()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    """`supervisor.py CTRL_FD CONFIG_JSON`, or `supervisor.py selftest CONFIG_JSON`."""
    nsops.set_dumpable(False)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    doc = json.loads(argv[2])
    config = Config(
        doc["workspace"], tuple(doc["tmp_ro"]), doc["private_net"], nsops.last_capability()
    )
    if argv[1] == "selftest":
        return selftest(config)
    ctrl = socket.socket(fileno=int(argv[1]))
    os.set_inheritable(ctrl.fileno(), False)
    # Each spare is a fork: the collector would walk (and so copy) every page of the
    # heap in each. Nothing here makes cycles worth a collection.
    gc.disable()
    gc.freeze()
    try:
        return Supervisor(ctrl, config).serve()
    except BaseException:
        _complain()
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
