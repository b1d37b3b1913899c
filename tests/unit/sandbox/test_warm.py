"""Warm bwrap's parts that need no sandbox: the wire between daemon and supervisor, a
call's rlimits, the sandbox's command line, the box's book-keeping of hosts."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import pytest

from execgate.executor.sandbox import Confinement, SandboxError, warmproto
from execgate.executor.sandbox.bwrap_warm import Host, Interpreter, WarmBox, bwrap_argv, discard
from execgate.executor.sandbox.cgroup import CallCgroup
from execgate.executor.sandbox.warm_call import rlimits
from execgate.executor.sandbox.warm_leaves import Leaves


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def test_a_message_and_its_descriptors_cross() -> None:
    a, b = pair()
    r, w = os.pipe()
    try:
        warmproto.send(a, {"op": "run", "argv": ["true"]}, [w])
        got = warmproto.receive(b)
        assert got is not None
        message, fds = got
        assert message == {"op": "run", "argv": ["true"]}
        assert len(fds) == 1
        assert not os.get_inheritable(fds[0])  # received close-on-exec
        os.write(fds[0], b"x")
        assert os.read(r, 1) == b"x"
        os.close(fds[0])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_a_body_too_long_for_a_datagram_travels_in_a_memfd() -> None:
    a, b = pair()
    try:
        big = {"op": "run", "env": {"X": "y" * (warmproto.MAX_INLINE * 3)}}
        warmproto.send(a, big, [])
        got = warmproto.receive(b)
        assert got is not None
        assert got[0] == big
        assert got[1] == []  # the memfd is consumed, not handed on
    finally:
        a.close()
        b.close()


def test_the_end_of_the_stream_is_none() -> None:
    a, b = pair()
    a.close()
    try:
        assert warmproto.receive(b) is None
    finally:
        b.close()


def test_a_calls_rlimits_are_a_cold_calls_and_leave_the_leafs_to_it(tmp_path: Path) -> None:
    conf = Confinement(cpu_seconds=7, file_size_bytes=1 << 20, open_files=99, processes=5)
    bare = dict(rlimits(conf, None))
    assert bare == {
        "cpu": 7,
        "fsize": 1 << 20,
        "nofile": 99,
        "nproc": 5,
        "as": conf.memory_bytes,
    }
    group = CallCgroup((tmp_path,))
    group.limits_pids = group.limits_memory = True
    assert set(dict(rlimits(conf, group))) == {"cpu", "fsize", "nofile"}
    # The key of a host: the same limits give the same key.
    assert rlimits(conf, None) == rlimits(Confinement(**vars_of(conf)), None)


def vars_of(conf: Confinement) -> dict[str, object]:
    return {f: getattr(conf, f) for f in conf.__dataclass_fields__}


def test_the_sandbox_is_a_cold_calls_with_the_supervisor_as_its_init() -> None:
    python = Interpreter(("/tmp/.execgate/python/bin/python3",), (("PYTHONHOME", "/x"),), ())
    argv = bwrap_argv(("run", "/ws", False), python, (Path("/tmp/venv"),), 7)
    line = " ".join(argv)
    assert "--as-pid-1" in argv
    assert "--die-with-parent" in argv
    assert "--unshare-net" in argv
    # Capabilities: all dropped, three added back for the supervisor, no others.
    added = [argv[i + 1] for i, a in enumerate(argv) if a == "--cap-add"]
    assert sorted(added) == ["CAP_NET_ADMIN", "CAP_SETPCAP", "CAP_SYS_ADMIN"]
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--ro-bind /proc/sys /proc/sys" in line
    assert "--remount-ro / " in line
    assert "--remount-ro /dev" in line
    assert argv.index("--bind") < argv.index("--remount-ro", argv.index("--bind"))
    # The --sandbox-ro path under /tmp is re-attached over each host's fresh /tmp.
    config = json.loads(argv[-1])
    assert config == {"workspace": "/ws", "tmp_ro": ["/tmp/venv"], "private_net": True}
    assert argv[-2] == "7"
    assert "--unshare-net" not in bwrap_argv(("run", "/ws", True), python, (), 7)


class FakeLeaves(Leaves):
    def __init__(self) -> None:
        super().__init__(None, Confinement())

    def park(self) -> list[int]:
        return []


class Proc:
    pid = 4242
    returncode = None


async def box_with_supervisor() -> tuple[WarmBox, socket.socket]:
    ours, theirs = pair()
    ours.setblocking(False)
    box = WarmBox(("run", "/ws", False), Proc(), ours, FakeLeaves())  # type: ignore[arg-type]
    return box, theirs


def a_host(limits: tuple[tuple[str, int], ...]) -> Host:
    a, b = pair()
    b.close()
    return Host(1, os.open("/dev/null", os.O_RDONLY), a, limits)


def let_go(*hosts: Host) -> None:
    for host in hosts:
        discard(host)


def test_a_host_is_lent_by_its_limits_and_kept_when_given_back() -> None:
    asyncio.run(_lent_by_limits())


async def _lent_by_limits() -> None:
    box, supervisor = await box_with_supervisor()
    try:
        small, big = (("cpu", 1),), (("cpu", 2),)
        host = a_host(small)
        box.give_back(host)
        assert await box.take(small) is host
        # The last idle one taken: another with its limits is asked for ahead.
        assert asked_for(supervisor) == {"op": "host", "limits": {"cpu": 1}}
        # None idle with `big`: one is asked of the supervisor, which answers in order.
        asked = asyncio.ensure_future(box.take(big))
        await asyncio.sleep(0)
        assert asked_for(supervisor) == {"op": "host", "limits": {"cpu": 2}}
        other = a_host(big)
        box._handle({"op": "host", "pid": 8}, [os.dup(other.pidfd), os.dup(other.sock.fileno())])
        box._handle({"op": "host", "pid": 9}, [os.dup(other.pidfd), os.dup(other.sock.fileno())])
        lent = await asyncio.wait_for(asked, 5)
        assert (lent.limits, lent.pid) == (big, 9)  # the first came for `small`: kept idle
        again = await box.take(small)
        assert again.pid == 8
        let_go(host, other, lent, again)
    finally:
        box.close()
        supervisor.close()


def asked_for(supervisor: socket.socket) -> dict[str, object]:
    got = warmproto.receive(supervisor)
    assert got is not None
    return got[0]


def test_a_dead_supervisor_fails_its_waiters_and_lends_nothing() -> None:
    asyncio.run(_dead_supervisor())


async def _dead_supervisor() -> None:
    box, supervisor = await box_with_supervisor()
    waiting = asyncio.ensure_future(box.take((("cpu", 1),)))
    await asyncio.sleep(0)
    supervisor.close()  # the control socket ends: as when the supervisor dies
    with pytest.raises(SandboxError, match="supervisor is gone"):
        await asyncio.wait_for(waiting, 5)
    assert box.dead
    with pytest.raises(SandboxError):
        await box.take((("cpu", 1),))


def test_a_doomed_box_closes_when_its_last_call_leaves() -> None:
    asyncio.run(_doomed())


async def _doomed() -> None:
    box, supervisor = await box_with_supervisor()
    try:
        box.enter()
        box.doom()
        assert not box.dead  # a call is still in it
        box.leave()
        assert box.dead
    finally:
        supervisor.close()
