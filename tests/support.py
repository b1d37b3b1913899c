"""Helpers shared by the integration tests: waiting on observable state, streaming in a thread."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from execgate.client import Call, Client, Event, EventKind, ExecgateClientError, Outcome
from execgate.executor.sandbox import procscan


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


class Streamer:
    """`client.stream(calls)` in a background thread, with its own client; events collected."""

    def __init__(
        self, address: str, calls: list[Call], *, token: str | None = None, **kwargs: object
    ) -> None:
        self.events: list[Event] = []
        self.error: BaseException | None = None
        self._token = token
        self._thread = threading.Thread(
            target=self._run, args=(address, calls, kwargs), daemon=True
        )
        self._thread.start()

    def _run(self, address: str, calls: list[Call], kwargs: dict[str, object]) -> None:
        try:
            with Client(address, token=self._token) as c:
                for event in c.stream(calls, **kwargs):  # type: ignore[arg-type]
                    self.events.append(event)
        except ExecgateClientError as exc:  # e.g. the daemon went away under the stream
            self.error = exc

    def seen(self, kind: EventKind, call_id: str) -> bool:
        return any(e.kind is kind and e.call_id == call_id for e in list(self.events))

    def outcome(self, call_id: str) -> Outcome:
        for e in self.events:
            if e.kind is EventKind.FINISHED and e.call_id == call_id:
                assert e.outcome is not None
                return e.outcome
        raise AssertionError(f"no FINISHED event for {call_id}: {self.events}")

    def join(self, timeout: float = 15.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"


# ---------------------------------------------------------------- sandbox backends

# The backends a test may run a daemon with, weakest first.
# "bwrap" is the default bwrap (warm where the kernel allows it); "bwrap-cold" the same
# backend with --bwrap-mode cold: a sandbox built per call.
SANDBOX_BACKENDS = ("process", "bwrap", "bwrap-cold", "docker")


def backend_name(variant: str) -> str:
    """The backend a variant runs on ("bwrap-cold" -> "bwrap"), as outcomes name it."""
    return variant.split("-", 1)[0]


# The container's user is the workspace's owner (root: nobody); tests that let a docker
# call write in the workspace give it to this uid.
DOCKER_WORKSPACE_UID = 1000


def sandbox_serve_args(backend: str, root: Path) -> list[str]:
    """`execgate serve` arguments that put a daemon rooted at `root` on `backend`.

    Skips the test where the backend cannot run here: bwrap when it is not installed
    (a failure instead with EXECGATE_REQUIRE_SANDBOXES=1); docker when
    tests/docker_image.py is missing or unusable, or dockerd is unreachable (a
    failure instead with EXECGATE_REQUIRE_DOCKER=1). For docker the workspace is
    created here, owned by DOCKER_WORKSPACE_UID, so that calls may write in it.
    """
    if backend == "bwrap-cold":
        return [*sandbox_serve_args("bwrap", root), "--bwrap-mode", "cold"]
    args = ["--sandbox", backend]
    if backend == "process":
        return args
    if backend == "bwrap":
        if shutil.which("bwrap") is None:
            why = "bubblewrap (bwrap) is not installed"
            if os.environ.get("EXECGATE_REQUIRE_SANDBOXES") == "1":
                pytest.fail(f"EXECGATE_REQUIRE_SANDBOXES=1, but {why}", pytrace=False)
            pytest.skip(why)
        return args
    if backend != "docker":
        raise ValueError(f"unknown sandbox backend {backend!r}")
    image = docker_test_image()
    workspace = root / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    os.chown(workspace, DOCKER_WORKSPACE_UID, DOCKER_WORKSPACE_UID)
    return [*args, "--docker-image", image]


def docker_test_image(mcp: bool = False) -> str:
    """The offline test image (`mcp`: the one with the busybox MCP server), built if need
    be. Skips the test where dockerd or the image cannot be had, unless
    EXECGATE_REQUIRE_DOCKER=1 (CI), which makes that a failure."""
    required = os.environ.get("EXECGATE_REQUIRE_DOCKER") == "1"

    def unavailable(why: str) -> NoReturn:
        if required:
            pytest.fail(f"EXECGATE_REQUIRE_DOCKER=1, but {why}", pytrace=False)
        pytest.skip(why)

    try:
        from tests.docker_image import docker_available, ensure_mcp_image, ensure_test_image
    except ImportError as exc:
        unavailable(f"tests/docker_image.py is missing or does not import: {exc}")
    except Exception as exc:  # it is being written: broken is not our failure
        unavailable(f"tests/docker_image.py is broken: {type(exc).__name__}: {exc}")
    if not docker_available():
        unavailable("dockerd is not reachable")
    try:
        return ensure_mcp_image() if mcp else ensure_test_image()
    except Exception as exc:
        unavailable(f"cannot build the docker test image: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- processes on this host


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def work_pids(path: Path) -> list[int]:
    """Live host pids of the shell of a `work` call on `path` (argv: sh -c SCRIPT sh PATH ...).

    Not the sandbox's own processes (the cgroup-joining /bin/sh, prlimit, bwrap), whose
    argv carries the path too: they exist before the command runs.
    """
    want = str(path.resolve()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\x00")
        except OSError:
            continue
        if argv[:2] == [b"sh", b"-c"] and argv[4:5] == [want] and procscan.alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def work_sleeping(path: Path) -> bool:
    """A `work` call on `path` is in its sleep: it has read the file, and not written it yet."""
    return any(comm(kid) == "sleep" for pid in work_pids(path) for kid in procscan.children(pid))
