"""The process sandbox never hands a command root's powers (issue 13).

Through real daemons running as root (the test process's uid; skipped otherwise)
on the `process` backend: a command runs as an unprivileged user with no
capabilities and no-new-privileges, cannot read the daemon's environment or
memory nor ptrace it, gains nothing from a set-user-id binary, cannot write a
root-owned file outside the workspace; `--run-as` is honoured and uid 0 refused.
A daemon that is not root (started here as `nobody`) is non-dumpable: a command
of its own uid cannot read /proc/<daemon>/environ either.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Call, Client, Outcome, Status
from tests.daemon import RUN_AS_UID, Daemon, reachable_workspace

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs a daemon running as root (run the tests as root)"
)

# ptrace(PTRACE_ATTACH, pid): 0 if attached, else -1 and errno.
PTRACE = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
r = libc.ptrace(16, int(sys.argv[1]), None, None)
print(r, ctypes.get_errno())
"""
# Read the first page of the daemon's mapped text through /proc/<pid>/mem.
READ_MEM = """
import sys
pid = sys.argv[1]
start = int(open(f"/proc/{pid}/maps").readline().split("-")[0], 16)
with open(f"/proc/{pid}/mem", "rb") as f:
    f.seek(start)
    print(len(f.read(4096)))
"""
CAPS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def run(c: Client, *argv: str) -> Outcome:
    return c.run(Call(tool="run_command", arguments={"argv": list(argv)}))


def status_fields(c: Client) -> dict[str, str]:
    o = run(c, "cat", "/proc/self/status")
    assert o.status is Status.SUCCESS, o.message
    return dict(line.split(":\t", 1) for line in o.text.splitlines() if ":\t" in line)


@pytest.fixture(scope="module")
def root_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Client]]:
    root = tmp_path_factory.mktemp("privs")
    d = Daemon(root, "--sandbox", "process", env={"EXECGATE_TEST_SECRET": "s3cr3t"}).start()
    try:
        with Client(d.address) as c:
            yield d, c
    finally:
        d.stop()


def daemon_pid(d: Daemon) -> int:
    assert d.proc is not None
    return d.proc.pid


def test_commands_do_not_run_as_root(root_daemon: tuple[Daemon, Client]) -> None:
    _, c = root_daemon
    o = run(c, "id", "-u")
    assert o.status is Status.SUCCESS
    assert int(o.text) == RUN_AS_UID  # the workspace's owner (tests/daemon.py)
    assert int(run(c, "id", "-g").text) != 0
    assert status_fields(c)["Groups"].split() in ([], [str(RUN_AS_UID)])


def test_every_capability_set_is_empty_and_no_new_privs_is_set(
    root_daemon: tuple[Daemon, Client],
) -> None:
    fields = status_fields(root_daemon[1])
    assert {k: int(fields[k], 16) for k in CAPS} == dict.fromkeys(CAPS, 0)
    assert fields["NoNewPrivs"].strip() == "1"


@pytest.mark.parametrize("what", ["environ", "mem", "ptrace", "cat-environ"])
def test_a_command_cannot_reach_into_the_daemon(
    root_daemon: tuple[Daemon, Client], what: str
) -> None:
    d, c = root_daemon
    pid = str(daemon_pid(d))
    match what:
        case "environ":
            o = run(c, sys.executable, "-c", f"print(open('/proc/{pid}/environ').read())")
        case "mem":
            o = run(c, sys.executable, "-c", READ_MEM, pid)
        case "ptrace":
            o = run(c, sys.executable, "-c", PTRACE, pid)
            assert o.status is Status.SUCCESS, o.message
            result, errno = o.text.split()
            assert (result, errno) == ("-1", "1")  # EPERM
        case _:
            o = run(c, "cat", f"/proc/{pid}/environ")
    assert "s3cr3t" not in o.text
    if what != "ptrace":
        assert o.status is Status.FAILURE
        assert "Permission denied" in o.text


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A root-owned directory outside any workspace that the run-as user may traverse."""
    reachable_workspace(tmp_path / "x" / "placeholder")  # ancestors get o+x
    out = tmp_path / "x" / "outside"
    out.mkdir(mode=0o755)
    return out


def test_a_setuid_root_binary_gains_nothing(
    root_daemon: tuple[Daemon, Client], outside: Path
) -> None:
    suid = outside / "id"
    shutil.copy("/usr/bin/id", suid)
    suid.chmod(0o4755)
    # The check can fail: without no-new-privs this binary runs with euid 0.
    here = subprocess.run(
        ["setpriv", f"--reuid={RUN_AS_UID}", f"--regid={RUN_AS_UID}", "--clear-groups",
         str(suid), "-u"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if here.stdout.strip() != "0":
        pytest.skip(f"set-user-id binaries do not work on {outside} (nosuid?)")
    o = run(root_daemon[1], str(suid), "-u")
    assert o.status is Status.SUCCESS
    assert int(o.text) == RUN_AS_UID


def test_a_root_owned_file_outside_the_workspace_cannot_be_written(
    root_daemon: tuple[Daemon, Client], outside: Path
) -> None:
    target = outside / "owned-by-root"
    target.write_text("original\n")
    target.chmod(0o644)
    o = run(root_daemon[1], "sh", "-c", f"echo changed > {target}")
    assert o.status is Status.FAILURE
    assert target.read_text() == "original\n"
    o = run(root_daemon[1], "touch", str(outside / "new"))
    assert o.status is Status.FAILURE
    assert not (outside / "new").exists()


def test_the_startup_log_and_doctor_say_what_the_process_backend_isolates(
    root_daemon: tuple[Daemon, Client], tmp_path: Path
) -> None:
    statement = "no-new-privs, capabilities dropped; NO file-system or network isolation"
    assert f"runs as uid {RUN_AS_UID}" in root_daemon[0].log()
    assert statement in root_daemon[0].log()
    doctor = subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", "doctor", "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    line = next(x for x in doctor.stdout.splitlines() if x.startswith("process"))
    assert "runs as uid" in line
    assert statement in line


def other_user() -> pwd.struct_passwd:
    for entry in pwd.getpwall():
        if entry.pw_uid not in (0, RUN_AS_UID) and entry.pw_gid != 0:
            return entry
    pytest.skip("no unprivileged user other than nobody on this host")


def test_run_as_is_honoured(tmp_path: Path) -> None:
    who = other_user()
    d = Daemon(tmp_path, "--sandbox", "process", "--run-as", f"{who.pw_name}:{who.pw_gid}")
    d.start()
    try:
        with Client(d.address) as c:
            assert run(c, "id", "-u").text.strip() == str(who.pw_uid)
            assert run(c, "id", "-g").text.strip() == str(who.pw_gid)
        # That user cannot write the fixture's workspace (nobody's): the log says so.
        assert "is not writable by" in d.log()
    finally:
        d.stop()


def test_a_root_owned_workspace_runs_commands_as_nobody(tmp_path: Path) -> None:
    (tmp_path / "workspace").mkdir()  # owned by root: the default is nobody
    d = Daemon(tmp_path, "--sandbox", "process").start()
    try:
        with Client(d.address) as c:
            assert run(c, "id", "-un").text.strip() == pwd.getpwuid(RUN_AS_UID).pw_name
    finally:
        d.stop()


@pytest.mark.parametrize("spec", ["root", "0", "0:0", "nobody:0", "nobody:root", "no-such-user"])
def test_a_privileged_or_unknown_run_as_is_refused_at_startup(tmp_path: Path, spec: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", "serve", "--sandbox", "process",
         "--workspace", str(tmp_path / "ws"), "--state-dir", str(tmp_path / "st"),
         f"--run-as={spec}"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "execgate: --run-as" in done.stderr  # the daemon's refusal, not argparse's
    assert "Traceback" not in done.stderr


def test_a_non_root_daemon_is_not_dumpable_to_its_own_commands(tmp_path: Path) -> None:
    """The daemon runs as nobody, and so do its commands: only PR_SET_DUMPABLE 0
    keeps a command from reading the daemon's environment."""
    root = tmp_path / "nobody"
    reachable_workspace(root / "workspace")
    os.chown(root, RUN_AS_UID, RUN_AS_UID)
    d = Daemon(root, "--sandbox", "process", env={"EXECGATE_TEST_SECRET": "s3cr3t"})
    d.start_as(RUN_AS_UID)
    try:
        with Client(d.address) as c:
            assert run(c, "id", "-u").text.strip() == str(RUN_AS_UID)
            o = run(c, "cat", f"/proc/{daemon_pid(d)}/environ")
            assert o.status is Status.FAILURE
            assert "s3cr3t" not in o.text
            assert status_fields(c)["NoNewPrivs"].strip() == "1"
    finally:
        d.stop()
