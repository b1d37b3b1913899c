"""What a sandboxed call cannot take: processes and memory, on every backend.

The daemons run with a policy that gives run_command `processes: 64` and
`memory_mb: 64` (see probe_support.py). On the process backend the pids limit is
the per-call cgroup's pids.max, which needs a writable pids controller; memory is
the cgroup's limit where there is one, else the address-space rlimit.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Status, StopMode
from execgate.executor.sandbox.cgroup import CgroupRoot, remove_root
from tests.probe_support import (
    PROCESSES,
    Box,
    assert_healthy,
    box_daemon,
    every_backend,
    new_tag,
    sh,
    tagged,
)


@pytest.fixture(scope="module")
def box(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    """One daemon per backend for the module (parametrized indirectly by each test)."""
    yield from box_daemon(request, tmp_path_factory)


def memory_controller_writable() -> bool:
    """Can a per-call cgroup here carry a memory limit? (What the daemon's leaves get.)"""
    root = CgroupRoot("probe-" + new_tag()[:8])
    try:
        return root.available and "no cgroup memory limit" not in root.describe()
    finally:
        remove_root(root)


def pids_controller_writable() -> bool:
    """May this process create a cgroup with a pids controller (v1 pids, or v2 with pids)?"""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return False
    candidates = []
    for line in lines:
        ident, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            candidates.append(Path("/sys/fs/cgroup/pids") / path.lstrip("/"))
        elif ident == "0" and controllers == "":
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                with contextlib.suppress(OSError):
                    if "pids" in (mount / "cgroup.controllers").read_text().split():
                        candidates.append(mount / path.lstrip("/"))
    for base in candidates:
        probe = base / f"execgate-probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.mkdir()
        except OSError:
            continue
        writable = (probe / "pids.max").exists()
        probe.rmdir()
        if writable:
            return True
    return False


# ---------------------------------------------------------------- limits


class PeakWatcher:
    """Samples the number of live tagged processes in a thread; keeps the peak."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, len(tagged(self.tag)))
            self.samples += 1
            time.sleep(0.001)  # leave the CPU to the daemon now and then

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@every_backend
def test_fork_bomb_is_held_by_the_pids_limit(box: Box) -> None:
    if box.backend == "process" and not pids_controller_writable():
        pytest.skip("the process backend's pids limit is a cgroup's pids.max: not writable here")
    tag = new_tag()
    watcher = PeakWatcher(tag)
    try:
        o = box.client.run(sh("b() { b | b & }; b; sleep 5", tag=tag, timeout=2))
    finally:
        watcher.stop()
    assert watcher.samples > 0
    # The watcher saw the call (a full /proc scan is slow next to a bomb's churn, so
    # on a loaded machine it may catch only one process at a time).
    assert watcher.peak >= 1, "the bomb never showed up on the host"
    # Held: never much more than the limit on the host (a little slack for a sample
    # taken while the kernel was still reaping).
    assert watcher.peak <= PROCESSES + 8, watcher.peak
    # The limit, not the timeout, is what held it: forks were refused.
    assert "fork" in o.text.lower(), o.text[:500]
    if o.stopped_how is StopMode.COMPLETED:
        # The bomb collapsed on its own: the main shell could not fork its `sleep` --
        # or, the sandbox's memory limit (64 MiB) being reached by that many shells
        # first, the kernel's OOM killer ended it: held by a limit either way.
        assert o.status is Status.FAILURE, o
        assert o.error_class in ("nonzero_exit", "resource_exhausted"), o
    else:
        assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "timeout"), o
        assert o.evidence.survivors == 0
    assert tagged(tag) == []
    assert_healthy(box)


@every_backend
def test_memory_bomb_is_held_by_the_memory_limit(box: Box) -> None:
    t0 = time.monotonic()
    o = box.client.run(sh("x=aaaaaaaa; while :; do x=$x$x; done", timeout=30))
    assert time.monotonic() - t0 < 20, "the bomb ran into the call's timeout, not a limit"
    assert o.status is Status.FAILURE, o
    assert o.stopped_how is StopMode.COMPLETED  # it ended by itself: nobody had to stop it
    if box.backend == "docker" or memory_controller_writable():
        # A memory cgroup (docker's, or the call's own leaf; memory = memory+swap =
        # 64 MiB): the kernel's OOM killer ends it, and the sandbox reports it.
        assert o.error_class == "resource_exhausted", o
        assert o.evidence.oom_killed is True
        assert o.evidence.signal == 9, o.evidence
    else:
        # No memory cgroup here: memory_mb is the address-space rlimit instead, which
        # makes the shell's allocations fail; it dies (SIGSEGV with dash) or exits with
        # an error. An ordinary failed command, not an OOM kill.
        assert o.error_class == "nonzero_exit", o
        assert o.evidence.signal is not None or o.evidence.exit_code not in (None, 0), o
        assert not o.evidence.oom_killed
    assert_healthy(box)
