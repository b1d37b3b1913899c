"""The offline images the docker tests and benchmarks run in: a static busybox, and the
same with an MCP server in it.

There is no registry to pull from, so an image is `docker import`ed from a root
file system built here out of the host's /bin/busybox (Debian: busybox-static):
the binary, one symlink per applet in /bin, a world-writable /tmp (docker copies
the image's /tmp mode onto the tmpfs the sandbox mounts there), and an
/etc/passwd and /etc/group that know root and nobody. The MCP image (MCP_IMAGE)
adds /srv/mcp-server, the busybox-sh server tests/fixtures/mcp/busybox_server.sh,
and /srv/marker, a file only that image has. Each builds in about a second.

An image carries a recipe label: an image of the same tag built some other way
(or by an older recipe, or from another server script) is rebuilt rather than trusted.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import time
from pathlib import Path

import docker  # type: ignore[import-untyped]
from docker.errors import DockerException, ImageNotFound  # type: ignore[import-untyped]
from filelock import FileLock

TEST_IMAGE = "execgate-test-busybox:1"
BUSYBOX = Path("/bin/busybox")
# Bump when the root file system below changes: existing images are then rebuilt.
RECIPE = "busybox-rootfs-2"
MCP_IMAGE = "execgate-test-mcp:1"
MCP_SERVER = Path(__file__).parent / "fixtures" / "mcp" / "busybox_server.sh"
# Where the MCP image has its server, and what its /srv/marker says.
MCP_SERVER_PATH, MCP_MARKER = "/srv/mcp-server", "execgate-test-mcp"
_RECIPE_LABEL = "execgate.test-recipe"
# Several test processes (or a bench beside them) may build at once: one does, the others wait.
_LOCK = Path("/tmp/execgate-test-image.lock")

_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = b"root:x:0:\nnogroup:x:65534:\n"


def docker_available() -> bool:
    """Is a docker daemon reachable from here?"""
    try:
        client = docker.from_env(timeout=10)
    except DockerException:
        return False
    try:
        return bool(client.ping())
    except (DockerException, OSError):
        return False
    finally:
        client.close()


def ensure_test_image() -> str:
    """Build TEST_IMAGE unless an image of this recipe is already there; returns its tag."""
    return _ensure(TEST_IMAGE, RECIPE, {})


def ensure_mcp_image() -> str:
    """Build MCP_IMAGE (busybox and the MCP server) unless it is current; returns its tag."""
    script = MCP_SERVER.read_bytes()
    recipe = f"{RECIPE}-mcp-{hashlib.sha256(script).hexdigest()[:16]}"
    extra = {"srv/mcp-server": (script, 0o755), "srv/marker": (MCP_MARKER.encode(), 0o644)}
    return _ensure(MCP_IMAGE, recipe, extra)


def _ensure(tag: str, recipe: str, extra: dict[str, tuple[bytes, int]]) -> str:
    client = docker.from_env(timeout=120)
    try:
        if _current(client, tag, recipe):
            return tag
        with FileLock(str(_LOCK), timeout=300):
            if not _current(client, tag, recipe):  # another process may have built it
                _build(client, tag, recipe, extra)
        return tag
    finally:
        client.close()


def _current(client: docker.DockerClient, tag: str, recipe: str) -> bool:
    try:
        labels = client.api.inspect_image(tag)["Config"].get("Labels") or {}
    except ImageNotFound:
        return False
    return bool(labels.get(_RECIPE_LABEL) == recipe)


def _build(
    client: docker.DockerClient, tag: str, recipe: str, extra: dict[str, tuple[bytes, int]]
) -> None:
    repository, _, version = tag.rpartition(":")
    client.api.import_image_from_data(
        _rootfs(extra),
        repository=repository,
        tag=version,
        changes=[f"LABEL {_RECIPE_LABEL}={recipe}"],
    )
    if not _current(client, tag, recipe):
        raise RuntimeError(f"docker import did not produce {tag} (recipe {recipe})")


def _rootfs(extra: dict[str, tuple[bytes, int]]) -> bytes:
    """The image's root file system as an uncompressed tarball; `extra`: path -> (content,
    mode) of files added (their directories are made 0755)."""
    if not BUSYBOX.is_file():
        raise RuntimeError(f"{BUSYBOX} is missing: install busybox-static")
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = {"bin": 0o755, "etc": 0o755, "tmp": 0o1777}
        dirs.update({path.rpartition("/")[0]: 0o755 for path in extra})
        for name, mode in dirs.items():
            tar.addfile(_entry(name, tarfile.DIRTYPE, mode))
        with BUSYBOX.open("rb") as f:
            tar.addfile(_entry("bin/busybox", tarfile.REGTYPE, 0o755, BUSYBOX.stat().st_size), f)
        for applet in applets:
            if applet != "busybox":
                tar.addfile(_entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
        files = {"etc/passwd": (_PASSWD, 0o644), "etc/group": (_GROUP, 0o644), **extra}
        for name, (data, mode) in files.items():
            tar.addfile(_entry(name, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))
    return buf.getvalue()


def _entry(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.mtime = int(time.time())
    return info
