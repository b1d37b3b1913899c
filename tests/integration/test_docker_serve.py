"""`Launch.serve` in the docker backend against the real dockerd: a long-lived server's
stdio over the attach connections, its stderr, its kill, and what is left when the
daemon that started it is SIGKILLed -- with its guard (nothing, at once), without it
(a server that exits on EOF ends by itself; the next start removes the container).

The server is tests/fixtures/mcp/busybox_server.sh in the offline MCP image
(tests/docker_image.py), spoken to with raw JSON-RPC lines here (the MCP session over
it is test_mcp_docker.py's). Skipped without dockerd, unless EXECGATE_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker  # type: ignore[import-untyped]
import pytest
from docker.errors import NotFound  # type: ignore[import-untyped]

from execgate.executor.sandbox import MARKER_ENV, Launch, SandboxError, Serving, procscan
from execgate.executor.sandbox.docker import DockerSandbox, ServingContainer
from execgate.executor.tools.mcp.connection import reap
from tests import mcp_support as ms
from tests.daemon import scaled
from tests.docker_image import MCP_SERVER_PATH
from tests.support import DOCKER_WORKSPACE_UID, comm, docker_test_image

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def images() -> tuple[str, str]:
    """(the plain busybox image, the MCP server's image)."""
    return docker_test_image(), docker_test_image(mcp=True)


@pytest.fixture(scope="module")
def api(images: tuple[str, str]) -> Iterator[docker.APIClient]:
    client = docker.from_env()
    yield client.api
    client.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, DOCKER_WORKSPACE_UID, DOCKER_WORKSPACE_UID)
    return ws


def serve(ws: Path, image: str, *args: str) -> Launch:
    return Launch(
        argv=(MCP_SERVER_PATH, *args),
        cwd=ws,
        env={"PATH": "/bin"},
        stdin=None,
        workspace=ws,
        writable=True,
        marker=secrets.token_hex(8),
        serve=True,
        image=image,
    )


async def rpc(running: Serving, rid: int, method: str, **params: Any) -> dict[str, Any]:
    """One JSON-RPC request over the server's stdio, and its answer."""
    stdin, stdout = running.stdio()
    request = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    # Compact, as the MCP SDK writes it (the busybox server reads no other spacing).
    stdin.write(json.dumps(request, separators=(",", ":")).encode() + b"\n")
    await stdin.drain()
    answer: dict[str, Any] = json.loads(await asyncio.wait_for(stdout.readline(), 20))
    assert answer["id"] == rid, answer
    return answer


def gone(api: docker.APIClient, cid: str) -> bool:
    try:
        api.inspect_container(cid)
    except NotFound:
        return True
    return False


def marked(launch: Launch) -> list[int]:
    """Host pids of the server's processes (every one carries the launch's marker)."""
    return procscan.with_marker(MARKER_ENV, launch.marker)


# ---------------------------------------------------------------- in one process


@pytest.mark.parametrize("mode", ["per-call", "warm"])
def test_stdio_stderr_and_kill(
    images: tuple[str, str], workspace: Path, api: docker.APIClient, mode: str
) -> None:
    """The default image is plain busybox: the server runs in the image its launch names,
    a container of its own in either mode; kill ends every process of it."""
    plain, mcp = images
    sandbox = DockerSandbox(plain, daemon_id=f"test-{secrets.token_hex(6)}", mode=mode)
    launch = serve(workspace, mcp)

    async def go() -> None:
        running = await sandbox.start(launch)
        assert isinstance(running, ServingContainer)
        try:
            hello = await rpc(running, 1, "initialize", protocolVersion="2025-06-18")
            assert hello["result"]["serverInfo"]["name"] == "busybox-sh"
            who = await rpc(running, 2, "tools/call", name="whoami", arguments={})
            text = who["result"]["content"][0]["text"]
            assert f"uid={DOCKER_WORKSPACE_UID} net=lo image=execgate-test-mcp" == text
            spawned = await rpc(running, 3, "tools/call", name="spawn", arguments={})
            assert "spawned" in spawned["result"]["content"][0]["text"]
            assert len(await running.survivors()) >= 3  # docker-init, sh, the setsid sleep
            assert len(marked(launch)) >= 2  # sh and the sleep (docker-init has no env)
            how = await running.kill()
            assert "SIGKILL to container" in how
            assert await reap(running) == []
            ended = await running.wait()
            assert (ended.code, ended.signal) == (None, signal.SIGKILL), ended
            out, err = await running.output()
            assert out.data == b""
            assert b"busybox-sh server up" in err.data, err
        finally:
            await running.release()
            await sandbox.close()
        assert marked(launch) == []
        assert gone(api, running.cid)

    asyncio.run(go())


def test_closing_stdin_ends_the_server(images: tuple[str, str], workspace: Path) -> None:
    """StdinOnce: closing our stdin connection is EOF on the server's stdin, while its
    output connection stays open to the end (its last stderr line arrives)."""
    plain, mcp = images
    sandbox = DockerSandbox(plain, daemon_id=f"test-{secrets.token_hex(6)}")

    async def go() -> None:
        running = await sandbox.start(serve(workspace, mcp))
        try:
            await rpc(running, 1, "ping")
            stdin, stdout = running.stdio()
            stdin.close()
            ended = await asyncio.wait_for(running.wait(), scaled(20))
            assert (ended.code, ended.signal) == (0, None), ended
            assert await stdout.read() == b""  # the stream ended with the container
            _, err = await running.output()
            assert b"busybox-sh server: stdin closed" in err.data, err
        finally:
            await running.release()
            await sandbox.close()

    asyncio.run(go())


def test_images_missing_or_not_given(images: tuple[str, str], workspace: Path) -> None:
    """No default image: a launch that names its image runs, one that does not is refused
    before anything starts; a missing image is named."""
    _, mcp = images
    sandbox = DockerSandbox("", daemon_id=f"test-{secrets.token_hex(6)}")
    assert sandbox.probe().ok
    assert "no default image" in sandbox.probe().detail

    async def go() -> None:
        try:
            running = await sandbox.start(serve(workspace, mcp))
            await rpc(running, 1, "ping")
            await running.kill()
            await running.release()
            with pytest.raises(SandboxError, match="no image for this call"):
                await sandbox.start(serve(workspace, ""))
            with pytest.raises(SandboxError, match="image execgate-no-such-image:0 not found"):
                await sandbox.start(serve(workspace, "execgate-no-such-image:0"))
        finally:
            await sandbox.close()

    asyncio.run(go())


# ---------------------------------------------------------------- its daemon SIGKILLed

# A stand-in daemon: starts the server (argv[5] "1": stubborn, it ignores EOF), checks
# its stdio, prints the container's id and its guard's pid, then waits to be killed.
OWNER = """
import asyncio, sys
from pathlib import Path
from execgate.executor.sandbox import Launch
from execgate.executor.sandbox.docker import DockerSandbox

async def main() -> None:
    image, ws, daemon_id, marker, stubborn = sys.argv[1:6]
    sandbox = DockerSandbox("", daemon_id=daemon_id)
    argv = ("/srv/mcp-server", "--stubborn") if stubborn == "1" else ("/srv/mcp-server",)
    launch = Launch(argv=argv, cwd=Path(ws), env={"PATH": "/bin"}, stdin=None,
                    workspace=Path(ws), writable=False, marker=marker, serve=True, image=image)
    running = await sandbox.start(launch)
    stdin, stdout = running.stdio()
    stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\\n')
    await stdin.drain()
    assert b'"id":1' in await stdout.readline()
    print(running.cid, sandbox.guard.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


class Owner:
    """The stand-in daemon, its server's container, and that container's guard."""

    def __init__(self, image: str, ws: Path, *, stubborn: bool) -> None:
        self.daemon_id = f"test-{secrets.token_hex(6)}"
        self.marker = secrets.token_hex(8)
        argv = [sys.executable, "-c", OWNER, image, str(ws), self.daemon_id, self.marker]
        self.proc = subprocess.Popen(
            [*argv, "1" if stubborn else "0"], stdout=subprocess.PIPE, start_new_session=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().split()
        assert len(line) == 2, f"the owner did not start its server: {line}"
        self.cid, self.guard = line[0], int(line[1])

    def server_pids(self) -> list[int]:
        return procscan.with_marker(MARKER_ENV, self.marker)

    def kill(self, *, guard_too: bool) -> None:
        if guard_too:
            os.kill(self.guard, signal.SIGKILL)
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def close(self, api: docker.APIClient) -> None:
        """What a failed check left: never an orphan of ours."""
        if self.proc.poll() is None:
            self.kill(guard_too=False)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if not gone(api, self.cid):
            api.remove_container(self.cid, force=True)


@pytest.mark.parametrize("stubborn", [False, True])
def test_the_guard_removes_the_container_when_its_daemon_dies(
    images: tuple[str, str], workspace: Path, api: docker.APIClient, stubborn: bool
) -> None:
    owner = Owner(images[1], workspace, stubborn=stubborn)
    try:
        assert owner.server_pids() != []
        owner.kill(guard_too=False)
        ms.wait_for(lambda: gone(api, owner.cid), 10, "the guard removed the container")
        ms.wait_for(lambda: owner.server_pids() == [], 5, "no process of the server left")
        ms.wait_for(lambda: not procscan.alive(owner.guard), 10, "the guard exited")
    finally:
        owner.close(api)


def test_without_its_guard_a_server_ends_on_eof_and_the_next_start_removes_it(
    images: tuple[str, str], workspace: Path, api: docker.APIClient
) -> None:
    """Guard and daemon SIGKILLed together: dockerd closes the server's stdin (StdinOnce)
    and it exits; its stopped container is the next start's to remove."""
    owner = Owner(images[1], workspace, stubborn=False)
    try:
        owner.kill(guard_too=True)
        ms.wait_for(lambda: owner.server_pids() == [], 10, "the server exited on EOF")
        assert not gone(api, owner.cid)
        restarted = DockerSandbox("", daemon_id=owner.daemon_id)
        assert asyncio.run(restarted.cleanup_stale()) == 1
        asyncio.run(restarted.close())
        assert gone(api, owner.cid)
    finally:
        owner.close(api)


def test_without_its_guard_a_stubborn_server_lives_until_the_next_start(
    images: tuple[str, str], workspace: Path, api: docker.APIClient
) -> None:
    """The limit of the design, shown: a server that ignores EOF, whose daemon and guard
    were both SIGKILLed, runs on until a daemon starts on the same state dir."""
    owner = Owner(images[1], workspace, stubborn=True)
    try:
        owner.kill(guard_too=True)
        # Its EOF loop runs `sleep 1` over and over: it read the EOF and stayed.
        ms.wait_for(lambda: "sleep" in map(comm, owner.server_pids()), 10, "the server ignored EOF")
        restarted = DockerSandbox("", daemon_id=owner.daemon_id)
        assert asyncio.run(restarted.cleanup_stale()) == 1
        asyncio.run(restarted.close())
        assert gone(api, owner.cid)
        ms.wait_for(lambda: owner.server_pids() == [], 5, "no process of the server left")
    finally:
        owner.close(api)


def test_a_dead_guard_is_started_again_and_sweeps_on_eof(
    images: tuple[str, str], workspace: Path, api: docker.APIClient
) -> None:
    """A guard killed while its daemon runs is replaced at the next container; a guard
    whose pipe ends without the daemon's word that it swept removes every container."""
    sandbox = DockerSandbox("", daemon_id=f"test-{secrets.token_hex(6)}")

    async def go() -> None:
        first = await sandbox.start(serve(workspace, images[1]))
        try:
            old = sandbox.guard.pid
            assert old is not None
            os.kill(old, signal.SIGKILL)
            await ms.await_for(lambda: not procscan.alive(old), 10, "the old guard is dead")
            second = await sandbox.start(serve(workspace, images[1]))
            assert sandbox.guard.pid not in (None, old)
            await asyncio.to_thread(sandbox.guard.close, swept=False)
            assert gone(api, first.cid)
            assert gone(api, second.cid)
            await second.release()
        finally:
            await first.release()
            await sandbox.close()

    asyncio.run(go())
