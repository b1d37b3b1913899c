"""Helpers of the sandbox probe tests (test_sandbox_probes.py, test_sandbox_limits.py).

See test_sandbox_probes.py for what the probes are and how they judge.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from execgate.client import Call, Client, Status
from execgate.executor.policy import default_policy_path
from execgate.executor.sandbox import procscan
from tests.daemon import Daemon
from tests.support import sandbox_serve_args

PROCESSES = 64
MEMORY_MB = 64
GRACE = 1.0
# "bwrap" runs warm (the default), "bwrap-cold" builds a sandbox per call.
ISOLATING = ["bwrap", "bwrap-cold", "docker"]
ALL = ["process", "bwrap", "bwrap-cold", "docker"]


# ---------------------------------------------------------------- daemons


@dataclass(frozen=True)
class Box:
    backend: str
    daemon: Daemon
    client: Client


def write_policy(path: Path, *, network: bool) -> Path:
    """The shipped policy, with run_command's sandbox entry limited (and its network set)."""
    doc = yaml.safe_load(default_policy_path().read_text())
    doc["sandbox"] = [
        {
            "tools": ["run_command"],
            "backend": "default",
            "network": network,
            "limits": {"processes": PROCESSES, "memory_mb": MEMORY_MB},
        },
        {"tools": ["work"], "backend": "default", "network": False},
    ]
    path.write_text(yaml.safe_dump(doc))
    return path


def start_box(backend: str, root: Path, *, network: bool = False) -> Daemon:
    args = sandbox_serve_args(backend, root)
    policy = write_policy(root / "policy.yaml", network=network)
    return Daemon(root, *args, "--policy", str(policy), "--grace", str(GRACE)).start()


def box_daemon(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Box]:
    """One daemon per backend for a module: each module's `box` fixture yields from this."""
    backend: str = request.param
    d = start_box(backend, tmp_path_factory.mktemp(f"probes-{backend}"))
    try:
        with Client(d.address) as c:
            yield Box(backend, d, c)
    finally:
        if d.proc is not None and d.proc.poll() is None:
            assert d.stop() == 0


# The backends that isolate the file system and the network; all three (limits only).
isolating = pytest.mark.parametrize("box", ISOLATING, indirect=True)
every_backend = pytest.mark.parametrize("box", ALL, indirect=True)


# ---------------------------------------------------------------- helpers


def sh(script: str, *args: str, tag: str = "", timeout: float | None = 20) -> Call:
    arguments: dict[str, object] = {"argv": ["sh", "-c", script, "sh", *args]}
    if tag:
        arguments["env"] = {"EG_TAG": tag}
    return Call(tool="run_command", arguments=arguments, timeout=timeout)


def assert_healthy(box: Box) -> None:
    """The daemon survived the probe: it serves, and runs a command."""
    d = box.daemon
    assert d.proc is not None
    assert d.proc.poll() is None, d.log()[-2000:]
    assert d.serving()
    o = box.client.run(Call(tool="run_command", arguments={"argv": ["echo", "still here"]}))
    assert o.status is Status.SUCCESS, o
    assert o.text == "still here\n"


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged(tag: str) -> list[int]:
    return procscan.with_marker("EG_TAG", tag)


@contextlib.contextmanager
def host_dir(parent: str, mode: int) -> Iterator[Path]:
    """A fresh directory on the host, outside every workspace, with `mode`."""
    path = Path(tempfile.mkdtemp(prefix="execgate-probe-", dir=parent))
    os.chmod(path, mode)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def host_ipv4() -> list[str]:
    """This host's non-loopback IPv4 addresses (docker0's gateway among them, if any)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [a for a in out.split() if ":" not in a and not a.startswith("127.")]


class Listener:
    """A TCP listener in the test; records every connection it gets and what was sent."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(0.05)
        self.port: int = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                data = b""
                with contextlib.suppress(OSError):
                    while chunk := conn.recv(4096):
                        data += chunk
                self.received.append(data)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def __repr__(self) -> str:
        return f"{self.host}:{self.port}"


@contextlib.contextmanager
def listeners(hosts: list[str]) -> Iterator[list[Listener]]:
    opened = [Listener(h) for h in hosts]
    try:
        yield opened
    finally:
        for lst in opened:
            lst.close()


def connect(backend: str, lst: Listener) -> Call:
    """A command that sends "hi" to the listener; it exits non-zero if it cannot connect."""
    if backend == "docker":  # the test image has busybox only
        return sh('echo hi | nc -w 2 "$1" "$2"', lst.host, str(lst.port))
    return Call(
        tool="run_command",
        arguments={"argv": ["bash", "-c", f"echo hi > /dev/tcp/{lst.host}/{lst.port}"]},
        timeout=20,
    )
