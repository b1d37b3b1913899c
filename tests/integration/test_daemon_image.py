"""The daemon's Docker image, built with no registry and run: a call through its socket.

The recipe the README and the Dockerfile give: a base image made offline
(docker/make-base-image.sh: debootstrap from the Debian mirror, `docker import`),
the wheels built on the host, `docker build --build-arg BASE=... --build-arg
WHEELS=...`. The container then serves its Unix socket in a volume, and a
command runs in the bubblewrap sandbox inside it as the image's unprivileged
user. Minutes of work: `make test-image` (and .ci/run) runs it, not `make test`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client, Status
from tests.docker_image import docker_available
from tests.support import wait_until

pytestmark = [pytest.mark.image, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
BASE = "execgate-base:bookworm"
BASE_RECIPE = "debootstrap-bookworm-1"  # docker/make-base-image.sh's label
IMAGE = "execgate-test-daemon:latest"
IMAGE_UID = 10001
RUN_OPTS = [
    "--security-opt", "seccomp=unconfined",
    "--security-opt", "apparmor=unconfined",
    "--security-opt", "systempaths=unconfined",
]  # fmt: skip


def _run(*argv: str, cwd: Path = ROOT, timeout: float = 900) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    tail = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{tail}"
    return done.stdout


def _base_is_current() -> bool:
    label = '{{index .Config.Labels "execgate.base-recipe"}}'
    done = subprocess.run(
        ["docker", "image", "inspect", "-f", label, BASE], capture_output=True, text=True
    )
    return done.returncode == 0 and done.stdout.strip() == BASE_RECIPE


def _context(into: Path) -> Path:
    """The checkout as git sees it (tracked and new files, nothing ignored)."""
    listed = _run("git", "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    return into


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not docker_available():
        pytest.skip("dockerd is not reachable")
    if not _base_is_current():
        if os.geteuid() != 0 or shutil.which("debootstrap") is None:
            pytest.skip("making the base image needs root and debootstrap")
        _run(str(ROOT / "docker" / "make-base-image.sh"), BASE, timeout=1200)
    context = _context(tmp_path_factory.mktemp("context"))
    wheels = ["-m", "pip", "wheel", "-q", ".[daemon]", "--wheel-dir", "wheels"]
    _run(sys.executable, *wheels, cwd=context)
    args = ["--build-arg", f"BASE={BASE}", "--build-arg", "WHEELS=wheels", "-t", IMAGE]
    _run("docker", "build", "-q", *args, ".", cwd=context)
    return IMAGE


@pytest.fixture
def served(image: str, tmp_path: Path) -> Iterator[Path]:
    state, ws = tmp_path / "state", tmp_path / "workspace"
    for d in (state, ws):
        d.mkdir(mode=0o700)
        os.chown(d, IMAGE_UID, IMAGE_UID)
    (ws / "hello.txt").write_text("hello from the host\n")
    mounts = ["-v", f"{state}:/var/lib/execgate", "-v", f"{ws}:/workspace"]
    cid = _run("docker", "run", "-d", *RUN_OPTS, *mounts, image).strip()
    try:
        socket = state / "execgate.sock"
        wait_until(lambda: socket.exists() and _healthy(socket), "the image's daemon", 60)
        yield state
    finally:
        logs = subprocess.run(["docker", "logs", cid], capture_output=True, text=True)
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
        (tmp_path / "container.log").write_text(logs.stdout + logs.stderr)


def _healthy(socket: Path) -> bool:
    with Client(f"unix:{socket}") as c:
        try:
            c.list_tools()
        except Exception:
            return False
    return True


def test_a_call_runs_in_the_images_bwrap_sandbox(served: Path) -> None:
    with Client(f"unix:{served / 'execgate.sock'}") as c:
        o = c.execute_one("run_command", argv=["sh", "-c", "cat hello.txt; id -u; echo x > out"])
        assert o.status is Status.SUCCESS, o
        assert o.evidence.sandbox == "bwrap"
        assert o.text.splitlines() == ["hello from the host", str(IMAGE_UID)]
        wrote = c.execute_one("read_file", path="out")
    assert wrote.text == "x\n"
    assert (served.parent / "workspace" / "out").stat().st_uid == IMAGE_UID
    # Owner-only state: the socket and the journal belong to the image's user alone.
    for name in ("execgate.sock", "journal.db"):
        st = (served / name).stat()
        assert (st.st_uid, st.st_mode & 0o077) == (IMAGE_UID, 0), name


def test_the_image_runs_as_its_unprivileged_user(image: str) -> None:
    uid = _run("docker", "run", "--rm", "--entrypoint", "id", image, "-u").strip()
    assert uid == str(IMAGE_UID)
    assert _run("docker", "run", "--rm", "--entrypoint", "sh", image, "-c", "command -v bwrap")
