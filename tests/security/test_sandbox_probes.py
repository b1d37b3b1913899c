"""What a sandboxed call cannot do: probes run from inside, checked from the host.

Each probe is a real command sent to a real daemon (`run_command`, or the `work`
test tool); what it achieved is judged on the host side -- the files there, the
TCP listeners the test opened, the processes carrying the probe's `EG_TAG` --
never only by what the command says about itself.

Backends: bwrap and docker get every probe. The process backend has NO
file-system or network isolation, by design (a call is a host process with the
daemon's view of the host; only the tools confine their paths), so only the
environment probe runs on it here; the resource limits (processes, memory) of
all three are probed in test_sandbox_limits.py.

The daemons here run with a policy that gives run_command `processes: 64` and
`memory_mb: 64`. Every probe ends by checking that the daemon is still healthy:
it serves, and a following call succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Call, Client, Status
from tests.probe_support import (
    ISOLATING,
    Box,
    assert_healthy,
    box_daemon,
    connect,
    every_backend,
    host_dir,
    host_ipv4,
    isolating,
    listeners,
    new_tag,
    sh,
    start_box,
    tagged,
)
from tests.support import Streamer, wait_until, work_pids, work_sleeping


@pytest.fixture(scope="module")
def box(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    """One daemon per backend for the module (parametrized indirectly by each test)."""
    yield from box_daemon(request, tmp_path_factory)


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
