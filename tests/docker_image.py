"""The offline image the docker tests and benchmarks run in: a static busybox, nothing else.

There is no registry to pull from, so the image is `docker import`ed from a root
file system built here out of the host's /bin/busybox (Debian: busybox-static):
the binary, one symlink per applet in /bin, a world-writable /tmp (docker copies
the image's /tmp mode onto the tmpfs the sandbox mounts there), and an
/etc/passwd and /etc/group that know root and nobody.

The image carries a recipe label: an image of the same tag built some other way
(or by an older recipe) is rebuilt rather than trusted.
"""

from __future__ import annotations

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
    client = docker.from_env(timeout=120)
    try:
        if _current(client):
            return TEST_IMAGE
        with FileLock(str(_LOCK), timeout=300):
            if not _current(client):  # another process may have built it meanwhile
                _build(client)
        return TEST_IMAGE
    finally:
        client.close()


def _current(client: docker.DockerClient) -> bool:
    try:
        labels = client.api.inspect_image(TEST_IMAGE)["Config"].get("Labels") or {}
    except ImageNotFound:
        return False
    return bool(labels.get(_RECIPE_LABEL) == RECIPE)


def _build(client: docker.DockerClient) -> None:
    repository, _, tag = TEST_IMAGE.rpartition(":")
    client.api.import_image_from_data(
        _rootfs(), repository=repository, tag=tag, changes=[f"LABEL {_RECIPE_LABEL}={RECIPE}"]
    )
    if not _current(client):
        raise RuntimeError(f"docker import did not produce {TEST_IMAGE} (recipe {RECIPE})")


def _rootfs() -> bytes:
    """The image's root file system as an uncompressed tarball."""
    if not BUSYBOX.is_file():
        raise RuntimeError(f"{BUSYBOX} is missing: install busybox-static")
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in (("bin", 0o755), ("etc", 0o755), ("tmp", 0o1777)):
            tar.addfile(_entry(name, tarfile.DIRTYPE, mode))
        with BUSYBOX.open("rb") as f:
            tar.addfile(_entry("bin/busybox", tarfile.REGTYPE, 0o755, BUSYBOX.stat().st_size), f)
        for applet in applets:
            if applet != "busybox":
                tar.addfile(_entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
        for name, data in (("etc/passwd", _PASSWD), ("etc/group", _GROUP)):
            tar.addfile(_entry(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    return buf.getvalue()


def _entry(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.mtime = int(time.time())
    return info
