"""A root-owned workspace and the docker sandbox, through a real daemon.

Containers never run as root, so commands cannot write a root-owned workspace;
the daemon says so at startup, naming the workspace and the fix, and a
workspace owned by a user gives that user's containers write access.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from execgate.client import Client, Status
from tests.daemon import Daemon
from tests.docker_image import docker_available, ensure_test_image

USER = 1000

if not docker_available():
    if os.environ.get("EXECGATE_REQUIRE_DOCKER") == "1":
        pytest.fail("EXECGATE_REQUIRE_DOCKER=1, but dockerd is not reachable", pytrace=False)
    pytest.skip("dockerd is not reachable", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("a root-owned workspace needs a daemon running as root", allow_module_level=True)


def _docker_daemon(root: Path) -> Daemon:
    return Daemon(root, "--sandbox", "docker", "--docker-image", ensure_test_image())


def _write(d: Daemon) -> Status:
    with Client(d.address) as c:
        return c.execute_one("run_command", argv=["sh", "-c", "echo x > made"]).status


def test_a_root_owned_workspace_is_named_at_startup(tmp_path: Path) -> None:
    (tmp_path / "workspace").mkdir()
    d = _docker_daemon(tmp_path).start()
    try:
        status = _write(d)
    finally:
        d.stop()
    assert "sandbox docker: the workspace" in d.log()
    assert "is owned by root" in d.log()
    assert status is Status.FAILURE  # nobody may not write there, as the warning said
    assert not (tmp_path / "workspace" / "made").exists()


def test_a_user_owned_workspace_is_written_as_its_owner(tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    ws.mkdir()
    os.chown(ws, USER, USER)
    d = _docker_daemon(tmp_path).start()
    try:
        status = _write(d)
    finally:
        d.stop()
    assert "sandbox docker: the workspace" not in d.log()
    assert status is Status.SUCCESS
    assert (ws / "made").stat().st_uid == USER
