"""What a sandboxed call cannot do: probes run from inside, checked from the host.

Each probe is a real command sent to a real daemon (`run_command`, or the `work`
test tool); what it achieved is judged on the host side -- the files there, the
TCP listeners the test opened, the processes carrying the probe's `EG_TAG` --
never only by what the command says about itself.

Backends: bwrap and docker get every probe. The process backend has NO
file-system or network isolation, by design (a call is a host process with the
daemon's view of the host; only the tools confine their paths), so only the
resource-limit probes (processes, memory) run on it; its pids limit is the
per-call cgroup's pids.max, which needs a writable pids controller.

The daemons here run with a policy that gives run_command `processes: 64` and
`memory_mb: 64`. Every probe ends by checking that the daemon is still healthy:
it serves, and a following call succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from execgate.client import Call, Client, Status, StopMode
from execgate.executor.policy import default_policy_path
from execgate.executor.sandbox import procscan
from execgate.executor.sandbox.cgroup import CgroupRoot, remove_root
from tests.daemon import Daemon
from tests.support import Streamer, sandbox_serve_args, wait_until

PROCESSES = 64
MEMORY_MB = 64
GRACE = 1.0
ISOLATING = ["bwrap", "docker"]
ALL = ["process", "bwrap", "docker"]


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


@pytest.fixture(scope="module")
def box(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    """One daemon per backend for the module (parametrized indirectly by each test)."""
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


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def work_pids(path: Path) -> list[int]:
    """Host pids of the shell of a `work` call on `path` (argv: sh -c SCRIPT sh PATH ...)."""
    want = str(path.resolve()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\x00")
        except OSError:
            continue
        if argv[:2] == [b"sh", b"-c"] and argv[4:5] == [want] and procscan.alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def work_sleeping(path: Path) -> bool:
    return any(_comm(kid) == "sleep" for pid in work_pids(path) for kid in procscan.children(pid))


def memory_controller_writable() -> bool:
    """Can a per-call cgroup here carry a memory limit? (What the daemon's leaves get.)"""
    root = CgroupRoot("probe-" + new_tag()[:8])
    try:
        return root.available and "no cgroup memory limit" not in root.describe()
    finally:
        remove_root(root)


def pids_controller_writable() -> bool:
    """May this process create a cgroup with a pids controller (v1 pids, or v2 with pids)?"""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return False
    candidates = []
    for line in lines:
        ident, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            candidates.append(Path("/sys/fs/cgroup/pids") / path.lstrip("/"))
        elif ident == "0" and controllers == "":
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                with contextlib.suppress(OSError):
                    if "pids" in (mount / "cgroup.controllers").read_text().split():
                        candidates.append(mount / path.lstrip("/"))
    for base in candidates:
        probe = base / f"execgate-probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.mkdir()
        except OSError:
            continue
        writable = (probe / "pids.max").exists()
        probe.rmdir()
        if writable:
            return True
    return False


# ---------------------------------------------------------------- network


@isolating
def test_network_is_unreachable(box: Box) -> None:
    hosts = ["127.0.0.1", *host_ipv4()]
    with listeners(hosts) as opened:
        for lst in opened:
            o = box.client.run(connect(box.backend, lst))
            assert (o.status, o.error_class) == (Status.FAILURE, "nonzero_exit"), (lst, o)
            # bash: "connect: Network is unreachable"; nc: "can't connect to remote host"
            assert "connect" in o.text, o.text
        time.sleep(0.1)  # a connection that did get through is accepted by now
    for lst in opened:
        assert lst.received == [], f"{lst} got a connection from inside the sandbox"
    assert_healthy(box)


@pytest.mark.parametrize("backend", ISOLATING)
def test_network_true_in_policy_connects(backend: str, tmp_path: Path) -> None:
    """The control: with the network opened by policy, the same probe gets through."""
    d = start_box(backend, tmp_path, network=True)
    try:
        with Client(d.address) as c:
            # Through docker's bridge, 127.0.0.1 is the container itself: only the
            # host's other addresses are the host. bwrap shares the host's network.
            hosts = host_ipv4() if backend == "docker" else ["127.0.0.1", *host_ipv4()]
            if not hosts:
                pytest.skip("this host has no non-loopback IPv4 address to connect to")
            with listeners(hosts) as opened:
                for lst in opened:
                    o = c.run(connect(backend, lst))
                    assert o.status is Status.SUCCESS, (lst, o)
                    wait_until(lambda lst=lst: lst.received, f"{lst} to receive the probe", 5)
                    assert lst.received == [b"hi\n"], lst.received
            assert_healthy(Box(backend, d, c))
    finally:
        if d.proc is not None and d.proc.poll() is None:
            assert d.stop() == 0


# ---------------------------------------------------------------- the host's files


@isolating
def test_writes_outside_the_workspace_never_reach_the_host(box: Box) -> None:
    tag = new_tag()[:12]
    ws = box.daemon.workspace
    inside = ws / f"inside-{tag}"
    # World-writable on the host: only the sandbox stands between the call and it.
    with host_dir("/var/tmp", 0o777) as outside:
        existing = outside / "existing.txt"
        existing.write_text("original\n")
        os.chmod(existing, 0o666)
        targets = [
            outside / f"new-{tag}",
            existing,
            box.daemon.root / f"beside-the-workspace-{tag}",
            Path("/tmp") / f"execgate-probe-{tag}",
            Path("/etc") / f"execgate-probe-{tag}",
            Path("/root") / f"execgate-probe-{tag}",
        ]
        try:
            o = box.client.run(
                sh(
                    'for f in "$@"; do '
                    '(echo pwned > "$f") 2>/dev/null && echo "wrote $f" || echo "refused $f"; '
                    "done",
                    str(inside),
                    *map(str, targets),
                )
            )
            assert o.status is Status.SUCCESS, o
            # The control: the same command wrote where it may.
            assert inside.read_text() == "pwned\n"
            # Inside, a private /tmp (and bwrap's scratch root) may take the write; the
            # host must not see any of it.
            for target in targets:
                if target == existing:
                    assert existing.read_text() == "original\n", o.text
                else:
                    assert not target.exists(), f"{target} was written from inside:\n{o.text}"
        finally:
            for target in targets[2:]:
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()
    assert_healthy(box)


@isolating
def test_files_outside_the_workspace_cannot_be_read(box: Box) -> None:
    secret = f"secret-{new_tag()}"
    # World-readable on the host: only the sandbox stands between the call and it.
    with host_dir("/var/tmp", 0o755) as outside:
        path = outside / "secret.txt"
        path.write_text(secret + "\n")
        os.chmod(path, 0o644)
        link = box.daemon.workspace / f"link-{secret[-8:]}"
        link.symlink_to(path)
        own = box.daemon.workspace / f"own-{secret[-8:]}.txt"
        own.write_text("readable\n")
        os.chmod(own, 0o644)
        try:
            # The control: the same command reads a file of the workspace.
            o = box.client.run(sh('cat "$1"', own.name))
            assert o.status is Status.SUCCESS, o
            assert o.text == "readable\n", o
            attempts = [str(path), link.name, f"/proc/1/root{path}"]
            for attempt in attempts:
                o = box.client.run(sh('cat "$1"', attempt))
                assert (o.status, o.error_class) == (Status.FAILURE, "nonzero_exit"), (attempt, o)
                assert secret not in o.text, f"{attempt} leaked the secret"
        finally:
            link.unlink()
            own.unlink()
    assert_healthy(box)


@isolating
def test_a_read_only_call_sees_the_workspace_read_only(box: Box) -> None:
    """No tool lets a read-only call run a command of our choosing (`work` with
    write=false never writes), so the probe goes through the call's own view of the
    file system instead: /proc/PID/root of its running shell, where a write lands on
    the very mounts the call sees. Read-only call: EROFS; writing call: it works."""
    ws = box.daemon.workspace
    for write in (False, True):
        name = f"ro-{new_tag()[:8]}"
        cid = f"{'writer' if write else 'reader'}-{name}"
        path = ws / name
        stream = Streamer(
            box.daemon.address,
            [
                Call(
                    tool="work",
                    arguments={"path": name, "write": write, "seconds": 30},
                    call_id=cid,
                )
            ],
        )
        wait_until(lambda path=path: work_sleeping(path), "the work call's sleep")
        pid = work_pids(path)[0]
        seen = Path(f"/proc/{pid}/root") / str(ws.resolve()).lstrip("/") / f"from-host-{name}"
        try:
            if write:
                seen.write_text("x")  # the control: the same route writes for a writer
                assert (ws / seen.name).read_text() == "x"
            else:
                with pytest.raises(OSError, match="Read-only file system") as refused:
                    seen.write_text("x")
                assert refused.value.errno == errno.EROFS, refused.value
                assert not (ws / seen.name).exists()
        finally:
            box.client.cancel(call_id=cid)
            stream.join()
            with contextlib.suppress(FileNotFoundError):
                (ws / seen.name).unlink()
        o = stream.outcome(cid)
        assert o.error_class == "cancelled", o
        assert o.status is (Status.UNKNOWN_OUTCOME if write else Status.FAILURE)
    assert_healthy(box)


# ---------------------------------------------------------------- limits


class PeakWatcher:
    """Samples the number of live tagged processes in a thread; keeps the peak."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, len(tagged(self.tag)))
            self.samples += 1
            time.sleep(0.001)  # leave the CPU to the daemon now and then

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@every_backend
def test_fork_bomb_is_held_by_the_pids_limit(box: Box) -> None:
    if box.backend == "process" and not pids_controller_writable():
        pytest.skip("the process backend's pids limit is a cgroup's pids.max: not writable here")
    tag = new_tag()
    watcher = PeakWatcher(tag)
    try:
        o = box.client.run(sh("b() { b | b & }; b; sleep 5", tag=tag, timeout=2))
    finally:
        watcher.stop()
    assert watcher.samples > 0
    # The watcher saw the call (a full /proc scan is slow next to a bomb's churn, so
    # on a loaded machine it may catch only one process at a time).
    assert watcher.peak >= 1, "the bomb never showed up on the host"
    # Held: never much more than the limit on the host (a little slack for a sample
    # taken while the kernel was still reaping).
    assert watcher.peak <= PROCESSES + 8, watcher.peak
    # The limit, not the timeout, is what held it: forks were refused.
    assert "fork" in o.text.lower(), o.text[:500]
    if o.stopped_how is StopMode.COMPLETED:
        # The bomb collapsed on its own: the main shell could not fork its `sleep`.
        assert (o.status, o.error_class) == (Status.FAILURE, "nonzero_exit"), o
    else:
        assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "timeout"), o
        assert o.evidence.survivors == 0
    assert tagged(tag) == []
    assert_healthy(box)


@every_backend
def test_memory_bomb_is_held_by_the_memory_limit(box: Box) -> None:
    t0 = time.monotonic()
    o = box.client.run(sh("x=aaaaaaaa; while :; do x=$x$x; done", timeout=30))
    assert time.monotonic() - t0 < 20, "the bomb ran into the call's timeout, not a limit"
    assert o.status is Status.FAILURE, o
    assert o.stopped_how is StopMode.COMPLETED  # it ended by itself: nobody had to stop it
    if box.backend == "docker" or memory_controller_writable():
        # A memory cgroup (docker's, or the call's own leaf; memory = memory+swap =
        # 64 MiB): the kernel's OOM killer ends it, and the sandbox reports it.
        assert o.error_class == "resource_exhausted", o
        assert o.evidence.oom_killed is True
        assert o.evidence.signal == 9, o.evidence
    else:
        # No memory cgroup here: memory_mb is the address-space rlimit instead, which
        # makes the shell's allocations fail; it dies (SIGSEGV with dash) or exits with
        # an error. An ordinary failed command, not an OOM kill.
        assert o.error_class == "nonzero_exit", o
        assert o.evidence.signal is not None or o.evidence.exit_code not in (None, 0), o
        assert not o.evidence.oom_killed
    assert_healthy(box)


# ---------------------------------------------------------------- the host's kernel and secrets


@isolating
def test_host_sysctls_are_read_only(box: Box) -> None:
    # A root daemon's bwrap commands run as uid 0 (without capabilities), and uid 0
    # may write many host-wide sysctls (core_pattern: a program the kernel runs as
    # root). The sandbox's /proc/sys is read-only; docker's too.
    target = Path("/proc/sys/kernel/printk_ratelimit")
    before = target.read_text()
    o = box.client.run(sh(f"cat {target} > /dev/null && echo {before.strip()} > {target}"))
    assert (o.status, o.error_class) == (Status.FAILURE, "nonzero_exit"), o
    assert "Read-only file system" in o.text, o.text
    assert target.read_text() == before
    assert_healthy(box)


@every_backend
def test_the_calls_environment_is_on_no_command_line(box: Box) -> None:
    # Secrets a call passes in `env` must not show in `ps` (any local user reads
    # /proc/*/cmdline); bwrap reads them from a memfd, not from its arguments.
    secret = "tok-" + uuid.uuid4().hex
    tag = new_tag()
    call = Call(
        tool="run_command",
        arguments={
            "argv": ["sh", "-c", "sleep 5"],
            "env": {"EG_TAG": tag, "API_TOKEN": secret},
        },
        call_id=f"env-{tag[:8]}",
    )
    stream = Streamer(box.daemon.address, [call])
    wait_until(lambda: tagged(tag), "the command")
    leaked = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and secret.encode() in (entry / "cmdline").read_bytes():
                leaked.append(int(entry.name))
    box.client.cancel(call_id=call.call_id)
    stream.join()
    assert leaked == []
    # ...while the command did get it (the environment itself is the place for it).
    o = box.client.run(
        Call(tool="run_command", arguments={"argv": ["env"], "env": {"API_TOKEN": secret}})
    )
    assert f"API_TOKEN={secret}" in o.text.splitlines()
