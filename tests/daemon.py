"""A real execgate daemon in a subprocess, on a temporary Unix socket, for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Under a root daemon the process sandbox runs commands as an unprivileged user (by
# default the workspace's owner): test workspaces are given to this one.
RUN_AS_UID = 65534


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
        if self.uid is not None:  # setpriv execs the daemon: the pid stays the daemon's
            cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", *cmd]
        log = open(self.log_path, "ab")  # noqa: SIM115 -- owned by the child's lifetime
        self.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            env={**os.environ, **self.env},
        )
        log.close()
        self.wait_serving(timeout)
        return self

    def start_as(self, uid: int, timeout: float = 20.0) -> Daemon:
        """Start the daemon as `uid` (this process must be root)."""
        self.uid = uid
        return self.start(timeout)

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            if self.socket.exists() and self.serving():
                return
            time.sleep(0.05)
        raise TimeoutError(f"daemon not serving after {timeout}s:\n{self.log()}")

    def serving(self) -> bool:
        with grpc.insecure_channel(self.address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=1
                )
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the daemon drains and exits."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the journal can tell."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def restart(self) -> Daemon:
        return self.start()
