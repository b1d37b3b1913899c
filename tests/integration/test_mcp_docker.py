"""An MCP server in the docker sandbox, through the real daemon: declared in the tools
file with `sandbox: {backend: docker, image: ...}` (no --docker-image given), its tools
listed and called, a cancel down the ladder, and a daemon SIGKILLed leaving no
container and no process -- its guard removes them at once; with the guard killed
too, the next start does.

The server is tests/fixtures/mcp/busybox_server.sh in the offline MCP image
(tests/docker_image.py). Skipped without dockerd, unless EXECGATE_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker  # type: ignore[import-untyped]
import pytest

from execgate.client import Call, Client, EventKind, Outcome, Status, StopMode
from execgate.executor.sandbox.dockerguard import MODULE as GUARD_MODULE
from execgate.executor.sandbox.registry import daemon_id
from tests import mcp_support as ms
from tests.daemon import Daemon
from tests.docker_image import MCP_MARKER, MCP_SERVER_PATH
from tests.support import DOCKER_WORKSPACE_UID, comm, docker_test_image

pytestmark = pytest.mark.timeout(180)

POLICY = """\
version: 1
default: deny
rules:
  - id: box
    effect: allow
    tools: ["box.*"]
    reason: the docker server's tools
"""


def _daemon(root: Path, tag: str, *args: str, prestart: bool = False) -> Daemon:
    image = docker_test_image(mcp=True)  # skips (fails in CI) without dockerd
    ws = root / "workspace"
    ws.mkdir(parents=True)
    os.chown(ws, DOCKER_WORKSPACE_UID, DOCKER_WORKSPACE_UID)
    (root / "policy.yaml").write_text(POLICY)
    server = {
        "name": "box",
        "command": MCP_SERVER_PATH,
        "args": list(args),
        "env": {"set": {ms.TAG_ENV: tag}},
        "prestart": prestart,
        "sandbox": {"backend": "docker", "image": image},
        # A reader by the operator's word: a cancelled reader may stop on a ping (a
        # cancelled writer needs its request answered, which the server never does).
        "tools": {"sleep": {"read_only": True}},
    }
    ms.tools_file(root / "tools.yaml", [server])
    policy, tools = str(root / "policy.yaml"), str(root / "tools.yaml")
    return Daemon(root, "--policy", policy, "--tools", tools, "--grace", "1")


@pytest.fixture(scope="module")
def api() -> Iterator[docker.APIClient]:
    client = docker.from_env()
    yield client.api
    client.close()


def containers(api: docker.APIClient, daemon: Daemon) -> list[str]:
    """Ids of the containers, running or not, that carry the daemon's id."""
    label = f"execgate.daemon={daemon_id(daemon.state_dir)}"
    return [str(c["Id"]) for c in api.containers(all=True, filters={"label": label})]


def nothing_left(api: docker.APIClient, daemon: Daemon, tag: str) -> bool:
    return containers(api, daemon) == [] and ms.tagged(tag) == []


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, api: docker.APIClient
) -> Iterator[tuple[Daemon, str]]:
    tag = ms.new_tag()
    daemon = _daemon(tmp_path_factory.mktemp("mcp-docker"), tag).start(timeout=60)
    yield daemon, tag
    daemon.stop()
    ms.wait_for(lambda: nothing_left(api, daemon, tag), 10, "nothing left after the stop")


@pytest.fixture
def eg(served: tuple[Daemon, str]) -> Iterator[Client]:
    with Client(served[0].address) as c:
        yield c


def test_tools_are_listed_and_a_call_succeeds_in_the_image(eg: Client) -> None:
    specs = {t.name: t for t in eg.list_tools()}
    assert {"box.echo", "box.whoami", "box.hang", "box.sleep", "box.spawn"} <= set(specs)
    assert specs["box.echo"].provider == "mcp:box"
    echoed = eg.execute_one("box.echo", text="hello")
    assert (echoed.status, echoed.text) == (Status.SUCCESS, "hello"), echoed
    who = eg.execute_one("box.whoami")
    assert who.status is Status.SUCCESS, who
    # The workspace's owner; no network but loopback (the policy opens none); the image.
    assert who.text == f"uid={DOCKER_WORKSPACE_UID} net=lo image={MCP_MARKER}", who


def _cancelled(eg: Client, tool: str, call_id: str, started: Any) -> Outcome:
    """Stream `tool`, cancel it once `started()` holds, return its outcome."""
    call = Call(tool=tool, arguments={"seconds": 600}, call_id=call_id)
    outcome = None
    for event in eg.stream([call], run_id=call_id):
        if event.kind is EventKind.STARTED:
            ms.wait_for(started, 20, f"{tool} running in its container")
            eg.cancel(call_id=call_id, run_id=call_id, reason="enough", grace=1)
        if event.kind is EventKind.FINISHED:
            outcome = event.outcome
    assert outcome is not None
    return outcome


def test_a_hung_server_is_cancelled_by_force_and_started_again(
    eg: Client, served: tuple[Daemon, str], api: docker.APIClient
) -> None:
    """`hang` reads nothing: the ping goes unanswered, so the ladder kills the container;
    nothing of it is left, and the next call gets a new one."""
    daemon, tag = served
    flag = daemon.workspace / "hang.started"
    flag.unlink(missing_ok=True)
    outcome = _cancelled(eg, "box.hang", "hang-1", flag.exists)
    # Untrusted: a writer, so an interrupted call may have done anything.
    assert (outcome.status, outcome.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled"), outcome
    assert outcome.stopped_how is StopMode.FORCE_TERMINATED, outcome
    assert outcome.evidence.survivors == 0, outcome
    for step in ("cancel_requested", "grace_expired", "force_terminated", "stopped"):
        assert outcome.mark(step) is not None, (step, outcome.timeline)
    ms.wait_for(lambda: nothing_left(api, daemon, tag), 10, "the killed server's container gone")
    again = eg.execute_one("box.echo", text="restarted")
    assert (again.status, again.text) == (Status.SUCCESS, "restarted"), again


def test_a_server_that_answers_pings_stops_cooperatively(
    eg: Client, served: tuple[Daemon, str]
) -> None:
    """`sleep` works in the background: the cancel reaches it and the ping is answered,
    so the server and its container live on for the next call."""
    _, tag = served

    def sleeping() -> bool:
        return "sleep" in map(comm, ms.tagged(tag))

    eg.execute_one("box.echo", text="up")  # the server is running before the call
    before = set(ms.tagged(tag))
    outcome = _cancelled(eg, "box.sleep", "sleep-1", sleeping)
    # A reader (the tools file says so): interrupted, it is a FAILURE, never unknown.
    assert (outcome.status, outcome.error_class) == (Status.FAILURE, "cancelled"), outcome
    assert outcome.stopped_how is StopMode.COOPERATIVE, outcome
    ms.wait_for(lambda: not sleeping(), 10, "the cancelled sleep ended")
    assert before <= set(ms.tagged(tag)), "the server was not restarted"
    again = eg.execute_one("box.echo", text="still here")
    assert (again.status, again.text) == (Status.SUCCESS, "still here"), again


# ---------------------------------------------------------------- the daemon SIGKILLed


def _guard_of(daemon: Daemon) -> int:
    """The pid of the daemon's docker guard (its command line names the daemon's id)."""
    ident = daemon_id(daemon.state_dir).encode()
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if GUARD_MODULE.encode() in argv and ident in argv:
            return int(entry.name)
    raise AssertionError(f"no docker guard for {daemon.state_dir}")


def _spawned(daemon: Daemon, tag: str) -> None:
    """A call that leaves a setsid'ed `sleep` in the server's container."""
    with Client(daemon.address) as eg:
        spawned = eg.execute_one("box.spawn")
        assert spawned.status is Status.SUCCESS, spawned
    assert len(ms.tagged(tag)) >= 2  # the server's sh and the sleep


@pytest.mark.parametrize("stubborn", [False, True], ids=["exits-on-eof", "ignores-eof"])
def test_daemon_sigkill_leaves_no_container_and_no_process(
    tmp_path: Path, api: docker.APIClient, stubborn: bool
) -> None:
    tag = ms.new_tag()
    args = ("--stubborn",) if stubborn else ()
    daemon = _daemon(tmp_path, tag, *args, prestart=True).start(timeout=60)
    try:
        _spawned(daemon, tag)
        assert len(containers(api, daemon)) == 1
        daemon.kill()
        ms.wait_for(lambda: nothing_left(api, daemon, tag), 15, "the guard removed everything")
        said = "execgate docker guard: removed 1 container(s)"  # after its second sweep
        ms.wait_for(lambda: said in daemon.log(), 10, "the guard's word in the daemon's log")
    finally:
        daemon.kill_group()
        for cid in containers(api, daemon):  # what a failed check left
            api.remove_container(cid, force=True)


def test_daemon_and_guard_sigkill_the_next_start_removes_the_server(
    tmp_path: Path, api: docker.APIClient
) -> None:
    """The limit of the design: with its guard SIGKILLed too, a server that ignores EOF
    runs on until a daemon starts on the same state dir, which removes it first."""
    tag = ms.new_tag()
    daemon = _daemon(tmp_path, tag, "--stubborn", prestart=True).start(timeout=60)
    try:
        _spawned(daemon, tag)
        [old] = containers(api, daemon)
        os.kill(_guard_of(daemon), signal.SIGKILL)
        daemon.kill()
        # Its EOF loop runs `sleep 1` over and over: it read the EOF and stayed.
        ms.wait_for(lambda: "sleep" in map(comm, ms.tagged(tag)), 10, "the server ignored EOF")
        assert containers(api, daemon) == [old]
        daemon.start(timeout=60)
        assert old not in containers(api, daemon)
        with Client(daemon.address) as eg:  # the new daemon's own server
            assert eg.execute_one("box.echo", text="new").text == "new"
        daemon.stop()
        ms.wait_for(lambda: nothing_left(api, daemon, tag), 10, "nothing left after the stop")
    finally:
        daemon.kill_group()
        for cid in containers(api, daemon):
            api.remove_container(cid, force=True)
