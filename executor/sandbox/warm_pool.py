"""The `bwrap` backend in warm mode: calls in warm sandboxes, kept per run.

`WarmBwrapSandbox` is the bwrap backend whose calls run in warm sandboxes
(bwrap_warm.py: one per run, workspace and network setting; warm_call.py: a call
in one). A server (`Launch.serve`, an MCP server) still gets a cold bwrap of its
own: it lives long, and its start costs nothing per call. So does a call the pool
has no room for: same isolation, built for it. No room is `most` sandboxes
none of which has been idle for EVICT_IDLE_SECONDS, or MAX_BUILDING builds under way
for other keys. A call never waits for another key's build: with more busy keys than
sandboxes (many workspaces or runs at once), evicting a box that is about to be used
again and building another one per call cost more than a cold sandbox, and queueing
every build behind one lock made the tail seconds long (bench/load.py, `workspaces`
mode: p99 8 s with 64 workspaces).

The probe runs the supervisor's self-test in a real sandbox (the mount API, a PID
namespace inside the sandbox, dropping every capability): a kernel without them
gets the cold mode, with the reason in the startup log and `execgate doctor`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import tempfile
import time
from pathlib import Path

from .base import Confinement, Launch, Probe, Running
from .bwrap import BwrapSandbox, _system_roots
from .bwrap_warm import (
    Interpreter,
    Key,
    Limits,
    WarmBox,
    build,
    bwrap_argv,
    interpreter,
)
from .cgroup import CgroupRoot
from .warm_call import rlimits, start_call
from .warm_leaves import Leaves

log = logging.getLogger("execgate.sandbox")

MODES = ("warm", "cold")
IDLE_SECONDS = 300.0
# The default of `--warm-sandboxes`: one per busy run or workspace on a daemon serving
# 64 clients at once (bench/load.py). A warm sandbox with its hosts holds ~14 MiB; idle
# ones close after IDLE_SECONDS.
MAX_SANDBOXES = 64
# A box idle this long may be closed to make room for another key's.
EVICT_IDLE_SECONDS = 2.0
# Builds under way at once (each is a bwrap and a supervisor starting: CPU-bound).
MAX_BUILDING = 2


class WarmPool:
    """The warm sandboxes of one daemon, by key (run, workspace, network).

    Invariant: a box in `_boxes` is not doomed; a doomed box is closed as soon as it
    has no call (`WarmBox.leave`).
    """

    def __init__(
        self,
        python: Interpreter,
        extra_ro: tuple[Path, ...],
        leaves: Leaves,
        most: int = MAX_SANDBOXES,
    ) -> None:
        self.most = most
        self.python = python
        self.extra_ro = extra_ro
        self.leaves = leaves
        self._boxes: dict[Key, WarmBox] = {}
        # Boxes closed or doomed, to be reaped at shutdown.
        self._retired: list[WarmBox] = []
        # Invariant: a key is here exactly while its box is being built (the task is
        # the pool's: `close` waits for it).
        self._builds: dict[Key, asyncio.Task[WarmBox]] = {}

    async def box(self, launch: Launch, limits: Limits) -> WarmBox | None:
        """The warm sandbox for `launch` (built if need be, its first hosts with
        `limits`), or None: no room."""
        key = (launch.run_id, str(launch.workspace), launch.confinement.network)
        self._expire()
        box = self._boxes.get(key)
        if box is not None and not box.stale():
            return box
        if box is not None:
            self._retire(box)
        building = self._builds.get(key)
        if building is None:
            if len(self._builds) >= MAX_BUILDING or not self._room():
                return None
            building = asyncio.ensure_future(self._build(key, limits))
            # Its error is each waiting call's; with none left waiting, it is only a box
            # the run's next call builds again.
            building.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._builds[key] = building
        # Shielded: a cancelled call leaves the build to finish for the run's next call.
        return await asyncio.shield(building)

    async def _build(self, key: Key, limits: Limits) -> WarmBox:
        try:
            box = await build(key, self.python, self.extra_ro, self.leaves, limits)
            self._boxes[key] = box
            return box
        finally:
            del self._builds[key]

    def _room(self) -> bool:
        if len(self._boxes) + len(self._builds) < self.most:
            return True
        stale = time.monotonic() - EVICT_IDLE_SECONDS
        idle = [b for b in self._boxes.values() if b.users == 0 and b.idle_since < stale]
        if not idle:
            return False
        self._retire(min(idle, key=lambda b: b.idle_since))
        return True

    def _expire(self) -> None:
        old = time.monotonic() - IDLE_SECONDS
        for box in list(self._boxes.values()):
            if box.dead or (box.users == 0 and box.idle_since < old):
                self._retire(box)

    def _retire(self, box: WarmBox) -> None:
        """Never hand `box` to a new call; close it once it has none."""
        self._boxes = {k: b for k, b in self._boxes.items() if b is not box}
        self._retired = [b for b in self._retired if b.proc.returncode is None]
        self._retired.append(box)
        box.doom()

    def run_ended(self, run_id: str) -> None:
        """The run's sandboxes go (at once, or when their last call ends)."""
        for key, box in list(self._boxes.items()):
            if key[0] == run_id:
                self._retire(box)

    async def close(self) -> None:
        # Builds under way end first (a box they make joins `_boxes`, closed below).
        await asyncio.gather(*self._builds.values(), return_exceptions=True)
        for box in list(self._boxes.values()):
            self._retire(box)
        for box in self._retired:
            box.close()
        await asyncio.gather(*(b.reap() for b in self._retired))
        self._retired.clear()
        await self.leaves.close()  # every call is over: their leaves are empty


class WarmBwrapSandbox:
    """bwrap, each run's calls in a warm sandbox (see the module docstring); servers
    and calls the pool has no room for in a cold one (`cold`)."""

    name = "bwrap"
    # The workspace read-only, the declared write paths bound read-write over it.
    confines_writes = True

    def __init__(
        self,
        cgroups: CgroupRoot | None = None,
        extra_ro: tuple[Path, ...] = (),
        limits: Confinement | None = None,
        most: int = MAX_SANDBOXES,
    ) -> None:
        self.cold = BwrapSandbox(cgroups, extra_ro)
        self.extra_ro = extra_ro
        self.python = interpreter((*_system_roots(), *(str(p) for p in extra_ro)))
        # Leaves are made ahead with the daemon's default limits (`limits`).
        leaves = Leaves(cgroups, limits or Confinement())
        self._pool = WarmPool(self.python, extra_ro, leaves, most) if self.python else None

    async def start(self, launch: Launch) -> Running:
        if self._pool is None or launch.serve:
            return await self.cold.start(launch)
        leaves = self._pool.leaves
        group = await leaves.take(launch.confinement)
        limits = rlimits(launch.confinement, group)
        try:
            box = await self._pool.box(launch, limits)
        except BaseException:
            leaves.done(group)
            raise
        if box is None:  # every warm sandbox is busy: this call gets one of its own
            leaves.done(group)
            return await self.cold.start(launch)
        box.enter()
        return await start_call(box, launch, group, limits)

    def run_ended(self, run_id: str) -> None:
        if self._pool is not None:
            self._pool.run_ended(run_id)

    async def cleanup_stale(self) -> int:
        return await self.cold.cleanup_stale()

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    def probe(self) -> Probe:
        cold = self.cold.probe()
        if not cold.ok:
            return cold
        why = self._warm_fails()
        if why:
            self._pool = None  # the cold mode, as in --bwrap-mode cold
            return Probe(self.name, True, f"{cold.detail}; cold mode: {why}")
        return Probe(self.name, True, f"{cold.detail}; warm mode")

    def _warm_fails(self) -> str:
        """Why warm sandboxes do not work here ("" if they do): the self-test."""
        if self.python is None:
            return "the daemon's interpreter is not under its sys.base_prefix"
        with tempfile.TemporaryDirectory(prefix="execgate-warm-probe-") as ws:
            argv = bwrap_argv(("probe", ws, False), self.python, self.extra_ro, 0)
            config = {"workspace": ws, "tmp_ro": [], "private_net": True}
            argv[-2:] = ["selftest", json.dumps(config)]
            try:
                done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"the self-test did not run: {exc}"
        if done.returncode != 0:
            lines = done.stderr.decode(errors="replace").strip().splitlines()
            return f"the self-test failed: {lines[-1] if lines else done.returncode}"
        return ""

    def warm(self) -> bool:
        return self._pool is not None
