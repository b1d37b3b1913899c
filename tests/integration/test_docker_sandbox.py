"""The docker backend against the real dockerd, driven by the cancellation ladder.

No gRPC daemon: each test builds a Launch the way run_command does, starts it in a
DockerSandbox and supervises it with `executor.cancel.supervise`, as
`tools.command.run_sandboxed` does. The image is the offline busybox one
(tests/docker_image.py). Skipped when dockerd is not reachable, unless
EXECGATE_REQUIRE_DOCKER=1 (CI), which makes that an error.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import docker  # type: ignore[import-untyped]
import pytest
from docker.errors import NotFound  # type: ignore[import-untyped]

from execgate.executor.core.outcomes import ErrorClass, Phase, StopMode
from execgate.executor.sandbox import (
    MARKER_ENV,
    Captured,
    Confinement,
    Launch,
    SandboxError,
    procscan,
)
from execgate.executor.sandbox.docker import DockerSandbox
from execgate.executor.sandbox.docker_warm import ExecRunning
from execgate.executor.sandbox.ladder import CancelScope, Stopped, supervise
from execgate.executor.tools.command import BASE_ENV
from tests.docker_image import docker_available, ensure_test_image

if not docker_available():
    if os.environ.get("EXECGATE_REQUIRE_DOCKER") == "1":
        pytest.fail("EXECGATE_REQUIRE_DOCKER=1, but dockerd is not reachable", pytrace=False)
    pytest.skip("dockerd is not reachable", allow_module_level=True)

USER = 1000
MiB = 1 << 20

# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def image() -> str:
    return ensure_test_image()


@pytest.fixture(scope="module")
def api() -> Iterator[docker.APIClient]:
    client = docker.from_env()
    yield client.api
    client.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace owned by a non-root user, who the container then runs as."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    for path in (ws, ws / "sub"):
        os.chown(path, USER, USER)
    return ws


@pytest.fixture
def daemon_id() -> str:
    """Each test its own: close and cleanup_stale touch only that test's containers."""
    return f"test-{secrets.token_hex(6)}"


@pytest.fixture
def per_call(image: str, daemon_id: str, api: docker.APIClient) -> Iterator[DockerSandbox]:
    yield from _sandbox(DockerSandbox(image, daemon_id=daemon_id), api)


@pytest.fixture
def warm(image: str, daemon_id: str, api: docker.APIClient) -> Iterator[DockerSandbox]:
    yield from _sandbox(DockerSandbox(image, daemon_id=daemon_id, mode="warm"), api)


def _sandbox(sandbox: DockerSandbox, api: docker.APIClient) -> Iterator[DockerSandbox]:
    yield sandbox
    asyncio.run(sandbox.close())
    assert _labelled(api, "execgate.daemon", sandbox.dockerd.daemon_id) == []


def _labelled(api: docker.APIClient, label: str, value: str) -> list[str]:
    found = api.containers(all=True, filters={"label": f"{label}={value}"})
    return [str(c["Id"]) for c in found]


def launch(ws: Path, *argv: str, **kwargs: object) -> Launch:
    defaults: dict[str, object] = {
        "cwd": ws,
        "env": {**BASE_ENV, "HOME": str(ws)},
        "stdin": None,
        "writable": True,
        "marker": secrets.token_hex(8),
        "run_id": "run-1",
    }
    return Launch(argv=argv, workspace=ws, **{**defaults, **kwargs})  # type: ignore[arg-type]


@dataclass
class Ran:
    stopped: Stopped
    out: Captured
    err: Captured
    seconds: float
    description: str
    # Processes carrying the call's marker just before the cancel.
    marked_before_cancel: list[int] = field(default_factory=list)

    @property
    def stdout(self) -> str:
        return self.out.data.decode()

    def phases(self) -> list[Phase]:
        return [m.phase for m in self.stopped.marks]


def drive(
    sandbox: DockerSandbox,
    what: Launch,
    *,
    cancel_when: Path | None = None,
    limit: float = 20.0,
    grace: float = 1.0,
) -> Ran:
    """Start `what`, supervise it like run_command does, cancel once `cancel_when` exists."""
    return asyncio.run(_drive(sandbox, what, cancel_when, limit, grace))


async def _drive(
    sandbox: DockerSandbox, what: Launch, cancel_when: Path | None, limit: float, grace: float
) -> Ran:
    began = time.monotonic()
    running = await sandbox.start(what)
    scope = CancelScope()
    marked: list[int] = []
    try:
        stopping = asyncio.ensure_future(
            supervise(running, scope, time_limit=limit, grace=grace, max_grace=5.0)
        )
        if cancel_when is not None:
            await _appears(cancel_when)
            marked = procscan.with_marker(MARKER_ENV, what.marker)
            scope.cancel("test", requester="pytest")
        stopped = await stopping
        out, err = await running.output()
    finally:
        await running.release()
    ran = Ran(stopped, out, err, time.monotonic() - began, running.description, marked)
    assert procscan.with_marker(MARKER_ENV, what.marker) == [], "a process of the call survived"
    return ran


async def _appears(path: Path, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(path.exists):
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.01)


def _gone(api: docker.APIClient, cid: str) -> bool:
    try:
        api.inspect_container(cid)
    except NotFound:
        return True
    return False


# ---------------------------------------------------------------- running and output


def test_output_exit_code_stdin_env_and_cwd(per_call: DockerSandbox, workspace: Path) -> None:
    script = 'cat; echo oops >&2; echo "$EXECGATE_CALL $FOO $(pwd)"; exit 3'
    what = launch(
        workspace,
        *("sh", "-c", script),
        stdin=b"from stdin\n",
        env={**BASE_ENV, "FOO": "bar"},
        cwd=workspace / "sub",
    )
    ran = drive(per_call, what)
    assert ran.stopped.how is StopMode.COMPLETED
    assert ran.stopped.exit.code == 3
    assert ran.stopped.exit.signal is None
    assert ran.stdout == f"from stdin\n{what.marker} bar {workspace / 'sub'}\n"
    assert ran.err == Captured(b"oops\n", 5)


def test_success_and_stdin_closed_when_not_given(per_call: DockerSandbox, workspace: Path) -> None:
    ran = drive(per_call, launch(workspace, "sh", "-c", "cat; echo done"))
    assert ran.stopped.exit.code == 0
    assert ran.stdout == "done\n"


def test_output_is_capped_and_counted(per_call: DockerSandbox, workspace: Path) -> None:
    what = launch(workspace, "sh", "-c", "yes | head -c 300000; yes e | head -c 5000 >&2")
    ran = drive(per_call, replace(what, output_cap=1000))
    assert ran.out == Captured(b"y\n" * 500, 300000)
    assert ran.err.total == 5000
    assert len(ran.err.data) == 1000
    assert ran.err.truncated


def test_every_container_is_removed_after_release(
    per_call: DockerSandbox, workspace: Path, api: docker.APIClient
) -> None:
    what = launch(workspace, "true")
    ran = drive(per_call, what)
    assert ran.description.startswith("container ")
    assert _labelled(api, "execgate.call", what.marker) == []


# ---------------------------------------------------------------- confinement


def test_no_network(per_call: DockerSandbox, workspace: Path) -> None:
    # The control first: with the network opened, the host (the bridge's gateway) answers.
    find = "ls /sys/class/net; ip route | awk '/^default/ {print $3}'"
    opened = launch(workspace, "sh", "-c", find, confinement=Confinement(network=True))
    interfaces = drive(per_call, opened).stdout.split()
    gateway = interfaces.pop()
    assert "eth0" in interfaces
    probe = f"ls /sys/class/net; nc -w 3 {gateway} 9 </dev/null"
    reached = drive(per_call, replace(opened, argv=("sh", "-c", probe)))
    assert b"Connection refused" in reached.err.data
    closed = drive(per_call, launch(workspace, "sh", "-c", probe))
    assert closed.stdout.split() == ["lo"]
    assert closed.stopped.exit.code != 0
    assert b"Network is unreachable" in closed.err.data


FS_CHECKS = """
touch /etc/x 2>/dev/null && echo etc=written || echo etc=denied
touch /tmp/t && echo tmp=written || echo tmp=denied
echo hello > "$WS/made" 2>/dev/null && echo ws=written || echo ws=denied
cat "$WS/existing" 2>/dev/null || echo ws=unreadable
test -e "$OUTSIDE" && echo outside=visible || echo outside=hidden
echo uid=$(id -u)
"""


@pytest.mark.parametrize("writable", [True, False])
def test_file_system_confinement(per_call: DockerSandbox, workspace: Path, writable: bool) -> None:
    outside = workspace.parent / "outside"
    outside.write_text("secret")
    (workspace / "existing").write_text("ws=readable\n")
    env = {**BASE_ENV, "WS": str(workspace), "OUTSIDE": str(outside)}
    ran = drive(per_call, launch(workspace, "sh", "-c", FS_CHECKS, env=env, writable=writable))
    assert ran.stdout.split() == [
        "etc=denied",
        "tmp=written",
        "ws=written" if writable else "ws=denied",
        "ws=readable",
        "outside=hidden",
        f"uid={USER}",
    ]
    assert (workspace / "made").exists() is writable
    if writable:
        assert (workspace / "made").stat().st_uid == USER


def test_root_owned_workspace_runs_as_nobody(per_call: DockerSandbox, tmp_path: Path) -> None:
    ws = tmp_path / "rootws"
    ws.mkdir()
    assert ws.stat().st_uid == 0  # the tests run as root (they chown the workspace)
    ran = drive(per_call, launch(ws, "id", "-u"))
    assert ran.stdout == "65534\n"


# ---------------------------------------------------------------- stopping


def test_cooperative_cancel(per_call: DockerSandbox, workspace: Path) -> None:
    script = 'trap "exit 0" TERM; sleep 1000 & touch ready; wait'
    ran = drive(
        per_call, launch(workspace, "sh", "-c", script), cancel_when=workspace / "ready", grace=5.0
    )
    assert ran.stopped.how is StopMode.COOPERATIVE
    assert ran.stopped.reason is ErrorClass.CANCELLED
    assert ran.stopped.exit.code == 0
    assert ran.stopped.survivors == 0
    assert ran.phases() == [Phase.CANCEL_REQUESTED, Phase.SIGNAL_SENT, Phase.STOPPED]
    times = [m.at for m in ran.stopped.marks]
    assert times == sorted(times)
    assert times[-1] - times[0] < 2.0  # well inside the 5 s grace
    assert "SIGTERM to container" in ran.stopped.marks[1].detail


# Ignores SIGTERM, and leaves a grandchild in a session of its own that ignores it too.
ESCAPER = (
    'trap "" TERM; (setsid sh -c "trap \\"\\" TERM; touch grandchild; sleep 1000" &); sleep 1000'
)


def test_force_kills_setsid_grandchild(
    per_call: DockerSandbox, workspace: Path, api: docker.APIClient
) -> None:
    what = launch(workspace, "sh", "-c", ESCAPER)
    ran = drive(per_call, what, cancel_when=workspace / "grandchild")
    assert len(ran.marked_before_cancel) >= 2  # the command and its setsid grandchild
    assert ran.stopped.how is StopMode.FORCE_TERMINATED
    assert ran.stopped.exit.signal == 9
    assert ran.stopped.survivors == 0
    assert ran.phases() == [
        Phase.CANCEL_REQUESTED,
        Phase.SIGNAL_SENT,
        Phase.GRACE_EXPIRED,
        Phase.FORCE_TERMINATED,
        Phase.STOPPED,
    ]
    grace_at = next(m.at for m in ran.stopped.marks if m.phase is Phase.GRACE_EXPIRED)
    assert grace_at - ran.stopped.marks[0].at >= 0.95  # the 1 s grace, then force
    assert ran.seconds < 10
    # (drive asserted that no process with the call's marker is left on the host)
    assert _labelled(api, "execgate.call", what.marker) == []
    assert _gone(api, ran.description.split()[1])


def test_timeout(per_call: DockerSandbox, workspace: Path) -> None:
    ran = drive(per_call, launch(workspace, "sleep", "1000"), limit=1.0, grace=2.0)
    assert ran.stopped.reason is ErrorClass.TIMEOUT
    assert ran.stopped.how is StopMode.COOPERATIVE  # sleep dies of the SIGTERM
    assert ran.stopped.exit.signal == 15
    assert ran.stopped.exit.code is None
    assert ran.stopped.marks[0].detail == "timeout after 1s"


# ---------------------------------------------------------------- limits


def test_fork_bomb_is_held_by_the_pids_limit(per_call: DockerSandbox, workspace: Path) -> None:
    # The main shell forks its sleep before the bomb: once the bomb holds every pid, a
    # fork of its own would fail and end it (busybox sh exits on "can't fork").
    bomb = "sleep 2 & s=$!; b() { b | b & }; b; wait $s; echo main-survived"
    ran = drive(
        per_call, launch(workspace, "sh", "-c", bomb, confinement=Confinement(processes=32))
    )
    assert ran.stopped.how is StopMode.COMPLETED
    assert ran.stdout == "main-survived\n"
    assert b"can't fork" in ran.err.data
    assert drive(per_call, launch(workspace, "echo", "after")).stdout == "after\n"


def test_memory_bomb_is_oom_killed(per_call: DockerSandbox, workspace: Path) -> None:
    bomb = launch(
        workspace,
        *("sh", "-c", "x=a; while :; do x=$x$x; done"),
        confinement=Confinement(memory_bytes=64 * MiB),
    )
    ran = drive(per_call, bomb)
    # The shell is the biggest process in the container: the OOM killer takes it.
    assert ran.stopped.how is StopMode.COMPLETED
    assert ran.stopped.exit.oom_killed
    assert ran.stopped.exit.signal == 9
    assert ran.stopped.exit.code is None


# ---------------------------------------------------------------- cleanup


def test_cleanup_stale_removes_a_crashed_daemons_containers(
    image: str, daemon_id: str, api: docker.APIClient
) -> None:
    def leftover(owner: str) -> str:
        labels = {"execgate.daemon": owner, "execgate.call": "c1", "execgate.run": "r1"}
        cid = str(api.create_container(image, command=["sleep", "1000"], labels=labels)["Id"])
        api.start(cid)
        return cid

    ours, theirs = leftover(daemon_id), leftover(daemon_id + "-other")
    try:
        restarted = DockerSandbox(image, daemon_id=daemon_id)
        assert asyncio.run(restarted.cleanup_stale()) == 1
        assert _gone(api, ours)
        assert not _gone(api, theirs)
        assert asyncio.run(restarted.cleanup_stale()) == 0
        asyncio.run(restarted.close())
    finally:
        for cid in (ours, theirs):
            api.remove_container(cid, force=True) if not _gone(api, cid) else None


def test_probe_and_a_missing_image(image: str, daemon_id: str, workspace: Path) -> None:
    assert DockerSandbox(image, daemon_id=daemon_id).probe().ok
    missing = DockerSandbox("execgate-no-such-image:0", daemon_id=daemon_id)
    probe = missing.probe()
    assert not probe.ok
    assert "execgate-no-such-image:0 not found" in probe.detail
    with pytest.raises(SandboxError, match="execgate-no-such-image:0 not found"):
        asyncio.run(missing.start(launch(workspace, "true")))


# ---------------------------------------------------------------- warm mode


def test_warm_calls_share_one_container(
    warm: DockerSandbox, workspace: Path, api: docker.APIClient, daemon_id: str
) -> None:
    async def two() -> tuple[str, str]:
        first = await _drive(warm, launch(workspace, "sh", "-c", "echo one; exit 4"), None, 20, 1)
        second = await _drive(warm, launch(workspace, "cat", stdin=b"two"), None, 20, 1)
        assert (first.stdout, first.stopped.exit.code) == ("one\n", 4)
        assert (second.stdout, second.stopped.exit.code) == ("two", 0)
        return first.description, second.description

    first, second = asyncio.run(two())
    assert first.startswith("exec ")
    assert second.startswith("exec ")
    assert first.split()[-1] == second.split()[-1]  # "... in warm container <id>"
    assert len(_labelled(api, "execgate.daemon", daemon_id)) == 1


def test_warm_finish_kills_what_the_command_left(warm: DockerSandbox, workspace: Path) -> None:
    ran = drive(warm, launch(workspace, "sh", "-c", "sleep 1000 & echo started"))
    assert ran.stopped.how is StopMode.COMPLETED
    assert ran.stdout == "started\n"
    # (drive asserted that no process with the call's marker is left)


def test_warm_cancel_and_force(warm: DockerSandbox, workspace: Path, api: docker.APIClient) -> None:
    async def scenario() -> None:
        coop = launch(workspace, "sh", "-c", 'trap "exit 0" TERM; sleep 1000 & touch ready; wait')
        ran = await _drive(warm, coop, workspace / "ready", 20.0, 5.0)
        assert ran.stopped.how is StopMode.COOPERATIVE
        assert ran.stopped.exit.code == 0
        cid = await _container_of(warm, workspace)

        escaper = launch(workspace, "sh", "-c", ESCAPER)
        forced = await _drive(warm, escaper, workspace / "grandchild", 20.0, 1.0)
        assert forced.stopped.how is StopMode.FORCE_TERMINATED
        assert forced.stopped.survivors == 0
        assert len(forced.marked_before_cancel) >= 2
        assert "removed" in forced.stopped.marks[3].detail
        assert _gone(api, cid)

        after = await _drive(warm, launch(workspace, "echo", "again"), None, 20.0, 1.0)
        assert after.stdout == "again\n"
        assert cid[:12] not in after.description

    asyncio.run(scenario())


def test_warm_memory_bomb_is_oom_killed(warm: DockerSandbox, workspace: Path) -> None:
    limited = Confinement(memory_bytes=64 * MiB)
    bomb = launch(workspace, "sh", "-c", "x=a; while :; do x=$x$x; done", confinement=limited)
    ran = drive(warm, bomb)
    assert ran.stopped.exit.oom_killed
    assert ran.stopped.exit.signal == 9
    # The OOM kill is not charged to the run's next call in that container.
    after = drive(warm, launch(workspace, "echo", "fine", confinement=limited))
    assert after.stdout == "fine\n"
    assert not after.stopped.exit.oom_killed


async def _container_of(sandbox: DockerSandbox, ws: Path) -> str:
    running = await sandbox.start(launch(ws, "true"))
    try:
        assert isinstance(running, ExecRunning)
        await running.wait()
        return running.warm.cid
    finally:
        await running.release()
