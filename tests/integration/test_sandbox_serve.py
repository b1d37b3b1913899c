"""`Launch.serve`: a long-lived server's stdio, and its death with the daemon's, in the
process and bwrap backends (a daemon SIGKILLed leaves no server behind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import mcp_support as ms
from tests.support import sandbox_serve_args

pytestmark = pytest.mark.timeout(60)

# A stand-in daemon: starts a server that echoes one line (its stdio works), then
# becomes a `sleep` that no closed pipe ends; says "ready" and waits to be killed.
OWNER = """
import asyncio, sys
from pathlib import Path
from execgate.executor.sandbox import Launch
from execgate.executor.sandbox.bwrap import BwrapSandbox
from execgate.executor.sandbox.privileges import Privileges, RunAs
from execgate.executor.sandbox.process import ProcessSandbox

async def main() -> None:
    backend, ws, tag = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if backend == "bwrap":
        sandbox = BwrapSandbox(None)
    else:
        run_as = RunAs(65534, 65534, "nobody") if __import__("os").geteuid() == 0 else None
        sandbox = ProcessSandbox(None, Privileges(run_as))
    launch = Launch(argv=("sh", "-c", 'read l; echo "$l"; exec sleep 600'), cwd=ws, stdin=None,
                    env={"PATH": "/usr/bin:/bin", "EG_TAG": tag}, workspace=ws,
                    writable=False, marker=tag, serve=True)
    running = await sandbox.start(launch)
    stdin, stdout = running.stdio()
    stdin.write(b"ping\\n")
    await stdin.drain()
    assert await stdout.readline() == b"ping\\n"
    print("ready", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


@pytest.mark.parametrize("backend", ["process", "bwrap"])
def test_server_dies_with_its_daemon(tmp_path: Path, backend: str) -> None:
    sandbox_serve_args(backend, tmp_path)  # skips (fails in CI) where bwrap is missing
    tag = ms.new_tag()
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, backend, str(tmp_path), tag],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline() == b"ready\n"
        ms.wait_for(lambda: "sleep" in map(_comm, ms.tagged(tag)), 5, "the server sleeps")
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        # process: PR_SET_PDEATHSIG (setpriv) ends the server itself; children it forks
        # are its cgroup leaf's, removed at the next start. bwrap: --die-with-parent
        # ends the namespace, children included.
        ms.wait_for(lambda: ms.tagged(tag) == [], 5, "no server process after the owner died")
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait(10)
        if owner.stdout is not None:
            owner.stdout.close()
        for pid in ms.tagged(tag):  # what a failed check left: never an orphan of ours
            os.kill(pid, signal.SIGKILL)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
