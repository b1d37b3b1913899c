"""A real execgate daemon in a subprocess, on a temporary Unix socket, for tests and benchmarks."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Under a root daemon the process sandbox runs commands as an unprivileged user (by
# default the workspace's owner): test workspaces are given to this one.
RUN_AS_UID = 65534

# A deadline in this file is stretched by the machine's load per core, up to this factor: a
# daemon that starts in 2s on an idle machine may take 10s beside a second test run.
MAX_LOAD_FACTOR = 8.0


def load_factor() -> float:
    """How much slower than idle this machine is likely to be now: the 1-minute load average
    per core, at least 1, at most `MAX_LOAD_FACTOR`."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return min(MAX_LOAD_FACTOR, max(1.0, load / (os.cpu_count() or 1)))


def scaled(seconds: float) -> float:
    """`seconds`, stretched for the machine's current load (`load_factor`)."""
    return seconds * load_factor()


# The `--journal` a daemon of a given root directory gets, when the test runs on PostgreSQL
# (set by tests/conftest.py's `journal_store` fixture; None: the SQLite default).
journal_for: Callable[[Path], str] | None = None


def journal_url(root: Path) -> str | None:
    """The PostgreSQL journal a daemon of `root` uses now, None for SQLite."""
    return journal_for(root) if journal_for is not None else None


# Every daemon this process started and has not stopped or killed: killed when this process
# exits, so that a test that forgot to stop one (or died before it could) leaves none behind.
# Strong references: a Daemon dropped while its process runs must still be found here.
_running: set[Daemon] = set()
# The state dirs of every daemon this process started: their cgroup directories are the
# only ones conftest's `tidy_cgroups` may remove (another test session's daemons on the
# same machine keep theirs: its empty leaves made ahead are in use).
started_state_dirs: set[Path] = set()


@atexit.register
def _kill_leftovers() -> None:
    for daemon in list(_running):
        daemon.kill_group()


def reachable_workspace(workspace: Path, uid: int = RUN_AS_UID) -> None:
    """When the tests run as root: create `workspace` owned by `uid`, and let that user
    traverse its ancestors (pytest's temporary directories are 0700), so that the
    commands a root daemon runs as `uid` can work in it. No-op otherwise, or if it exists.

    Group 0 and group-writable: bwrap's commands under a root daemon are uid 0 without
    capabilities (no CAP_DAC_OVERRIDE), and must be able to write it too."""
    if os.geteuid() != 0 or workspace.exists():
        return
    workspace.mkdir(parents=True)
    os.chown(workspace, uid, 0)
    workspace.chmod(0o2775)
    for parent in workspace.parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)


def give(path: Path, uid: int = RUN_AS_UID) -> Path:
    """A file a test made in the workspace, handed to the run-as user (when root) so that
    a command in the process sandbox may change it, as it could its own."""
    if os.geteuid() == 0:
        os.chown(path, uid, -1)
    return path


class Daemon:
    """`execgate serve` on `root/state/execgate.sock` with workspace `root/workspace`.

    Run as root, the workspace is made reachable for the process sandbox's run-as
    user first (`reachable_workspace`)."""

    def __init__(self, root: Path, *extra_args: str, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.workspace = root / "workspace"
        self.state_dir = root / "state"
        self.socket = self.state_dir / "execgate.sock"
        self.address = f"unix:{self.socket}"
        self.extra_args = extra_args
        # Added to this process's environment for the daemon (OTEL_*, say).
        self.env = env or {}
        self.log_path = root / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # Run the daemon itself as this uid (set by `start_as`); None: as this process.
        self.uid: int | None = None

    def start(self, timeout: float = 20.0) -> Daemon:
        """Start the daemon and wait until its health service reports SERVING, for `timeout`
        seconds scaled for the machine's load. A daemon that exits first, or is not serving by
        then, is killed with its whole process group, and the error raised carries its log."""
        reachable_workspace(self.workspace)
        cmd = [
            sys.executable,
            "-m",
            "execgate.executor.cli",
            "serve",
            "--workspace",
            str(self.workspace),
            "--state-dir",
            str(self.state_dir),
            "--test-tools",
            *self.extra_args,
        ]
        url = journal_url(self.root)
        if url is not None and "--journal" not in self.extra_args:
            cmd += ["--journal", url]
        if self.uid is not None:  # setpriv execs the daemon: the pid stays the daemon's
            cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", *cmd]
        log = open(self.log_path, "ab")  # noqa: SIM115 -- owned by the child's lifetime
        self.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            env={**os.environ, **self.env},
            # Its own process group: a daemon that fails to start is killed with everything
            # it spawned (`kill_group`).
            start_new_session=True,
        )
        log.close()
        _running.add(self)
        started_state_dirs.add(self.state_dir)
        try:
            self.wait_serving(timeout)
        except BaseException:
            self.kill_group()
            raise
        return self

    def start_as(self, uid: int, timeout: float = 20.0) -> Daemon:
        """Start the daemon as `uid` (this process must be root)."""
        self.uid = uid
        return self.start(timeout)

    def wait_serving(self, timeout: float) -> None:
        """Wait until the health service (grpc.health.v1 Check) reports SERVING, for
        `timeout` seconds scaled for the machine's load; raise with the daemon's log if it
        exits first or the deadline passes. The caller kills a daemon this raises for."""
        budget = scaled(timeout)
        deadline = time.monotonic() + budget
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"daemon not serving after {budget:.1f}s ({timeout}s scaled for load"
                    f" {load_factor():.1f}x):\n{self.log()}"
                )
            if self.socket.exists() and self.serving(timeout=min(left, scaled(1.0))):
                return
            time.sleep(0.05)  # a poll interval: what ends the wait is the health check

    def serving(self, timeout: float = 1.0) -> bool:
        """Whether the daemon's health service answers SERVING within `timeout` seconds."""
        with grpc.insecure_channel(self.address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=timeout
                )
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait (`timeout` scaled for load): the daemon drains and exits. One
        that has not exited by then is killed with its process group, and this raises with
        its log."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(scaled(timeout))
        except subprocess.TimeoutExpired as exc:
            self.kill_group()
            raise TimeoutError(
                f"daemon did not exit within {exc.timeout:.1f}s of SIGTERM; killed:\n{self.log()}"
            ) from exc
        _running.discard(self)
        return code

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the journal can tell."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        _running.discard(self)

    def kill_group(self) -> None:
        """SIGKILL the daemon and every process left in its process group, and reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()  # in case it has left its group (it never should)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        _running.discard(self)

    def restart(self) -> Daemon:
        return self.start()
