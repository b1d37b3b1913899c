"""Warm bwrap sandboxes through the real daemon: what a call shares, what it never sees.

A warm sandbox is built once per run (executor/sandbox/bwrap_warm.py); each call runs
in a host of it, in PID, mount, IPC and network namespaces of the call's own. These
tests look at the processes from the host side: a command's parent is its host, the
host's parent the supervisor, the supervisor's parent the sandbox's bwrap.

The probes of test_sandbox_probes.py and test_sandbox_limits.py run against both
modes ("bwrap" is warm, "bwrap-cold" cold); the stops of test_cancel.py too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Call, Client, EventKind, Status, StopMode
from execgate.client.loop.states import Machine, State
from tests.cancel_support import COOPERATIVE, STUBBORN, new_tag, sh, tagged
from tests.daemon import Daemon, scaled
from tests.support import Streamer, comm, sandbox_serve_args, wait_until

GRACE = 1.0


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("warm")
    d = Daemon(root, *sandbox_serve_args("bwrap", root), "--grace", str(GRACE)).start()
    yield d
    if d.proc is not None and d.proc.poll() is None:
        assert d.stop() == 0


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("cold")
    d = Daemon(root, *sandbox_serve_args("bwrap-cold", root), "--grace", str(GRACE)).start()
    yield d
    if d.proc is not None and d.proc.poll() is None:
        assert d.stop() == 0


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def sandbox_of(pid: int) -> int:
    """The bwrap a command runs under (0: none), walking up its parents."""
    while pid > 1:
        pid = parent(pid)
        if comm(pid) == "bwrap":
            return pid
    return 0


def pid_ns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def long_call(tag: str, call_id: str, script: str = "sleep 1000") -> Call:
    """A command that declares it touches nothing: it holds no lock, others run beside it."""
    return free(sh(script, call_id, tag=tag))


def free(call: Call) -> Call:
    return Call(tool=call.tool, arguments={**call.arguments, "reads": []}, call_id=call.call_id)


def running(d: Daemon, tag: str, call_id: str, run_id: str) -> Streamer:
    stream = Streamer(d.address, [long_call(tag, call_id)], run_id=run_id)
    wait_until(lambda: tagged(tag, "sleep"), "the call's sleep")
    return stream


def stop(d: Daemon, stream: Streamer, call_id: str, run_id: str) -> None:
    with Client(d.address, run_id=run_id) as c:
        c.cancel(call_id=call_id)
    stream.join(scaled(GRACE + 15))


# ---------------------------------------------------------------- sharing


def test_a_runs_calls_share_a_sandbox_and_nothing_else(warm: Daemon) -> None:
    run, other = f"r-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"
    calls = []
    for run_id in (run, run, other):
        tag = new_tag()
        cid = f"c-{tag[:8]}"
        calls.append((tag, cid, run_id, running(warm, tag, cid, run_id)))
    pids = [tagged(tag, "sleep")[0] for tag, *_ in calls]
    boxes = [sandbox_of(p) for p in pids]
    try:
        assert all(boxes), boxes
        assert boxes[0] == boxes[1] != boxes[2]  # one sandbox per run
        # ... and within it, each call in namespaces of its own.
        for kind in ("pid", "mnt", "ipc", "net"):
            links = {os.readlink(f"/proc/{p}/ns/{kind}") for p in pids}
            assert len(links) == 3, (kind, links)
    finally:
        for _, cid, run_id, stream in calls:
            stop(warm, stream, cid, run_id)


def test_nothing_a_call_leaves_is_there_for_the_next(warm: Daemon) -> None:
    run = f"r-{uuid.uuid4().hex[:8]}"
    leave = (
        "echo left > /tmp/left; echo left > /dev/shm/left; "
        "ipcmk -M 4096 >/dev/null; (setsid sleep 1000 &); echo ok"
    )
    look = "ls -A /tmp /dev/shm; ipcs -m | grep -c '^0x' ; ls /proc | grep -c '^[0-9]'"
    with Client(warm.address, run_id=run) as c:
        tag = new_tag()
        o = c.run(sh(leave, f"leave-{tag[:8]}", tag=tag))
        assert (o.status, o.text.strip()) == (Status.SUCCESS, "ok"), o
        assert tagged(tag) == []  # the background sleep went with the call
        for run_id in (run, f"r-{uuid.uuid4().hex[:8]}"):
            with Client(warm.address, run_id=run_id) as other:
                seen = other.run(sh(look, f"look-{uuid.uuid4().hex[:8]}"))
            assert seen.status is Status.SUCCESS, seen
            lines = seen.text.split()
            assert "left" not in lines, seen.text  # a fresh /tmp and /dev/shm
            # No shared memory segment, and only its own processes: sh, ls, grep (+ init).
            assert lines[-2] == "0", seen.text
            assert int(lines[-1]) <= 5, seen.text


# ---------------------------------------------------------------- stops


def test_a_force_stop_leaves_the_sandboxs_other_calls_running(warm: Daemon) -> None:
    run = f"r-{uuid.uuid4().hex[:8]}"
    stubborn_tag, other_tag = new_tag(), new_tag()
    stubborn, other = f"stub-{stubborn_tag[:8]}", f"other-{other_tag[:8]}"
    # Two calls of one run that declare they touch nothing: they run at once.
    calls = [
        free(sh(STUBBORN, stubborn, tag=stubborn_tag)),
        free(sh("sleep 3; echo done", other, tag=other_tag)),
    ]
    stream = Streamer(warm.address, calls, run_id=run)
    wait_until(lambda: len(tagged(stubborn_tag, "sleep")) >= 2, "both stubborn sleeps")
    wait_until(lambda: tagged(other_tag, "sleep"), "the other call's sleep")
    assert sandbox_of(tagged(stubborn_tag, "sleep")[0]) == sandbox_of(tagged(other_tag)[0])
    with Client(warm.address, run_id=run) as c:
        assert c.cancel(call_id=stubborn, grace=0.2) == [stubborn]
    wait_until(lambda: stream.seen(EventKind.FINISHED, stubborn), "the stubborn call's end")
    o = stream.outcome(stubborn)
    assert o.stopped_how is StopMode.FORCE_TERMINATED, o
    assert o.evidence.survivors == 0
    assert tagged(stubborn_tag) == []
    assert tagged(other_tag, "sleep"), "the other call died with it"
    stream.join(scaled(20))
    done = stream.outcome(other)
    assert (done.status, done.text) == (Status.SUCCESS, "done\n"), done


def test_a_cooperative_stop_of_a_warm_call(warm: Daemon) -> None:
    tag = new_tag()
    cid = f"coop-{tag[:8]}"
    stream = Streamer(warm.address, [sh(COOPERATIVE, cid, tag=tag)])
    wait_until(lambda: tagged(tag, "sleep"), "the command's sleep")
    with Client(warm.address) as c:
        c.cancel(call_id=cid)
    stream.join(scaled(15))
    o = stream.outcome(cid)
    assert o.stopped_how is StopMode.COOPERATIVE, o
    assert o.evidence.survivors == 0
    assert tagged(tag) == []


def test_a_sandbox_whose_supervisor_dies_is_replaced(warm: Daemon) -> None:
    run = f"r-{uuid.uuid4().hex[:8]}"
    tag = new_tag()
    cid = f"victim-{tag[:8]}"
    stream = running(warm, tag, cid, run)
    sleep = tagged(tag, "sleep")[0]
    box = sandbox_of(sleep)
    (supervisor,) = _children(box)  # --as-pid-1: bwrap's one child
    os.kill(supervisor, signal.SIGKILL)
    stream.join(scaled(15))
    o = stream.outcome(cid)
    assert o.status is Status.UNKNOWN_OUTCOME or o.evidence.signal == 9, o
    wait_until(lambda: tagged(tag) == [], "the call's processes to go with the sandbox")
    wait_until(lambda: not Path(f"/proc/{box}").exists(), "the dead sandbox's bwrap to go")
    # The run's next call gets a new sandbox.
    tag2 = new_tag()
    stream2 = running(warm, tag2, f"next-{tag2[:8]}", run)
    try:
        assert sandbox_of(tagged(tag2, "sleep")[0]) not in (0, box)
    finally:
        stop(warm, stream2, f"next-{tag2[:8]}", run)


def test_a_runs_sandbox_closes_when_the_run_ends(warm: Daemon) -> None:
    with Client(warm.address) as c:
        run = c.runs.start("a run with a warm sandbox")
        tag = new_tag()
        stream = running(warm, tag, f"mine-{tag[:8]}", run.run_id)
        box = sandbox_of(tagged(tag, "sleep")[0])
        stop(warm, stream, f"mine-{tag[:8]}", run.run_id)
        assert Path(f"/proc/{box}").exists(), "kept while the run goes on"
        c.runs.append(run.run_id, [Machine(run.run_id).advance(State.CANCELLED, "done")])
    wait_until(lambda: not Path(f"/proc/{box}").exists(), "the ended run's sandbox to close")


def _children(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        out += [int(p) for p in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return out


def test_a_sigkilled_daemon_leaves_no_warm_sandbox(tmp_path: Path) -> None:
    d = Daemon(tmp_path, *sandbox_serve_args("bwrap", tmp_path)).start()
    tag = new_tag()
    stream = Streamer(d.address, [long_call(tag, f"orphan-{tag[:8]}", STUBBORN)])
    wait_until(lambda: len(tagged(tag, "sleep")) >= 2, "both sleeps")
    box = sandbox_of(tagged(tag, "sleep")[0])
    inside = _tree(box)
    d.kill()
    wait_until(lambda: tagged(tag) == [], "the call's processes to die with the daemon")
    wait_until(
        lambda: not any(Path(f"/proc/{p}").exists() for p in [box, *inside]),
        "the sandbox's processes to die with the daemon",
    )
    stream.join(scaled(15))


def _tree(pid: int) -> list[int]:
    found = []
    for child in _children(pid):
        found += [child, *_tree(child)]
    return found


# ---------------------------------------------------------------- what a call gets


PROBE = r"""
grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapAmb|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
cat /proc/self/limits | tail -n +2
for d in / /tmp /dev /dev/shm /proc/sys/kernel . sub other; do
  if (: > "$d/probe-$$") 2>/dev/null; then echo "write $d: yes"; rm -f "$d/probe-$$"
  else echo "write $d: no"; fi
done
hostname; id -u; id -g
"""


def _probe(d: Daemon, writable: bool) -> dict[str, str]:
    (d.workspace / "sub").mkdir(exist_ok=True)
    (d.workspace / "other").mkdir(exist_ok=True)
    args: dict[str, object] = {"argv": ["sh", "-c", PROBE]}
    if not writable:
        args["writes"] = ["sub"]
    with Client(d.address) as c:
        o = c.run(Call(tool="run_command", arguments=args))
    assert o.status is Status.SUCCESS, o
    lines = {}
    for line in o.text.splitlines():
        key, _, value = line.partition(":") if ":" in line else (line, "", "")
        lines[key.strip() or line] = " ".join(value.split())
    return lines


@pytest.mark.parametrize("writable", [True, False], ids=["writer", "declared-writes"])
def test_a_warm_call_gets_exactly_what_a_cold_one_gets(
    warm: Daemon, cold: Daemon, writable: bool
) -> None:
    w, c = _probe(warm, writable), _probe(cold, writable)
    bounding_w, bounding_c = int(w.pop("CapBnd"), 16), int(c.pop("CapBnd"), 16)
    # The bounding set: warm empties it, cold keeps it; neither can use it (no-new-privs,
    # no permitted capability). Warm never holds more than cold.
    assert bounding_w & ~bounding_c == 0
    assert w == c
    assert w["CapEff"] == w["CapPrm"] == w["CapAmb"] == "0000000000000000"
    assert w["NoNewPrivs"] == "1"
    assert w["write /"] == w["write /dev"] == w["write /proc/sys/kernel"] == "no"
    assert w["write /tmp"] == w["write /dev/shm"] == "yes"
    assert w["write sub"] == "yes"
    assert w["write other"] == ("yes" if writable else "no")


def test_a_refused_call_leaves_its_host_usable(warm: Daemon) -> None:
    run = f"r-{uuid.uuid4().hex[:8]}"
    with Client(warm.address, run_id=run) as c:
        missing = c.run(Call(tool="run_command", arguments={"argv": ["no-such-program-xyz"]}))
        assert missing.error_class == "not_found", missing
        for _ in range(3):
            o = c.run(Call(tool="run_command", arguments={"argv": ["echo", "fine"]}))
            assert (o.status, o.text) == (Status.SUCCESS, "fine\n"), o


def test_a_request_larger_than_a_datagram(warm: Daemon) -> None:
    # Past warmproto.MAX_INLINE (the request then goes in a memfd); each argument under
    # the kernel's 128 KiB per string.
    parts = ["x" * (60 * 1024)] * 3
    script = 'for a in "$@"; do printf %s "$a"; done | wc -c'
    with Client(warm.address) as c:
        o = c.run(Call(tool="run_command", arguments={"argv": ["sh", "-c", script, "sh", *parts]}))
        assert (o.status, o.text.strip()) == (Status.SUCCESS, str(3 * 60 * 1024)), o
        # One argument past that: refused as a cold sandbox refuses it (E2BIG).
        too_long = c.run(Call(tool="run_command", arguments={"argv": ["echo", "x" * (200 << 10)]}))
    assert too_long.error_class == "sandbox_error", too_long
    assert "Argument list too long" in too_long.message, too_long


def test_stdin_reaches_a_warm_call(warm: Daemon) -> None:
    with Client(warm.address) as c:
        o = c.run(Call(tool="run_command", arguments={"argv": ["cat"], "stdin": "fed\n"}))
    assert (o.status, o.text) == (Status.SUCCESS, "fed\n"), o


def test_the_warm_self_test_passes_in_a_user_namespace(tmp_path: Path) -> None:
    """A non-root daemon's warm sandbox is in a user namespace, where the kernel locks
    the sandbox's mounts and allows a new /proc only beside a fully visible one: the
    supervisor's self-test (a host's whole path, twice) must pass there too."""
    from execgate.executor.sandbox.bwrap import _system_roots
    from execgate.executor.sandbox.bwrap_warm import bwrap_argv, interpreter

    python = interpreter(_system_roots())
    if python is None:
        pytest.skip("this interpreter cannot run in a warm sandbox here")
    argv = bwrap_argv(("probe", str(tmp_path), False), python, (), 0)
    if "--unshare-user" not in argv:
        argv.insert(1, "--unshare-user")
    config = {"workspace": str(tmp_path), "tmp_ro": [], "private_net": True}
    argv[-2:] = ["selftest", json.dumps(config)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
