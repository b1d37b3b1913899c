"""Per-call cgroups: a pids and memory limit, a complete list of members, and a kill.

Where the daemon may create cgroups (root, or a delegated subtree), every
process-based call gets its own leaf under the daemon's cgroup in each usable
hierarchy: cgroup v2 (where `cgroup.kill` ends a whole tree at once, and
`pids.max` / `memory.max` apply when those controllers are enabled) and the v1
`pids` and `memory` hierarchies of a hybrid host. A process joins its leaf
before it execs the command, so nothing it forks can be outside.

Leaves live under `<daemon cgroup>/execgate-<id>/`, where `<id>` is the
daemon's state-dir id: a daemon that restarts after a crash finds the leaves of
its predecessor, kills what is still in them and removes them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from .base import Confinement

log = logging.getLogger("execgate.sandbox")

_V1_CONTROLLERS = ("pids", "memory")
_MEMORY_LIMITS = ("memory.max", "memory.limit_in_bytes")


@dataclass(frozen=True, slots=True)
class _Hierarchy:
    kind: str  # "v2", "pids" or "memory"
    # The daemon's own cgroup directory in this hierarchy.
    base: Path


def _mounts() -> dict[str, Path]:
    """Mount points of the cgroup hierarchies we can use, by kind."""
    found: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if len(fields) < 5 or len(extra) < 3:
            continue
        mount, fstype, options = Path(fields[4]), extra[0], extra[2].split(",")
        if fstype == "cgroup2":
            found.setdefault("v2", mount)
        elif fstype == "cgroup":
            for controller in _V1_CONTROLLERS:
                if controller in options:
                    found.setdefault(controller, mount)
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path in each hierarchy kind."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        ident, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if ident == "0" and controllers == "":
            paths["v2"] = path
        for controller in _V1_CONTROLLERS:
            if controller in controllers.split(","):
                paths[controller] = path
    return paths


class CgroupRoot:
    """The daemon's `execgate-<id>` directory in every hierarchy it may write to."""

    def __init__(self, ident: str) -> None:
        self.name = f"execgate-{ident}"
        self.hierarchies: tuple[_Hierarchy, ...] = ()
        mounts, own = _mounts(), _own_paths()
        usable = []
        for kind, mount in mounts.items():
            if kind not in own:
                continue
            base = mount / own[kind].lstrip("/") / self.name
            try:
                base.mkdir(exist_ok=True)
            except OSError:
                continue
            usable.append(_Hierarchy(kind, base))
        self.hierarchies = tuple(usable)
        # Which limit files a leaf has, per hierarchy (learnt from the first leaf).
        self._limit_files: dict[Path, tuple[str, ...]] = {}

    @property
    def available(self) -> bool:
        return bool(self.hierarchies)

    def describe(self) -> str:
        """What the per-call cgroups give on this host, for `execgate doctor`."""
        if not self.hierarchies:
            return "no writable cgroup hierarchy (limits by rlimit only, kill by sweep)"
        kill = any(h.kind == "v2" for h in self.hierarchies)
        pids = any((h.base / "pids.max").exists() for h in self.hierarchies)
        memory = any(
            (h.base / name).exists()
            for h in self.hierarchies
            for name in ("memory.max", "memory.limit_in_bytes")
        )
        parts = [
            "cgroup.kill" if kill else "no cgroup.kill (member-by-member kill)",
            "pids limit" if pids else "NO pids limit (root ignores RLIMIT_NPROC)",
            "memory limit" if memory else "no cgroup memory limit (address-space rlimit only)",
        ]
        return "per-call cgroups: " + ", ".join(parts)

    def leaf(
        self, token: str, conf: Confinement, *, need_kill: bool = True, limit: bool = True
    ) -> CallCgroup | None:
        """The call's leaves. Without `need_kill` (a PID namespace kills for the caller),
        a v2 hierarchy that brings no limit of its own is skipped: each leaf costs.
        Without `limit`, no limit is written (a leaf that only holds processes)."""
        dirs = []
        for h in self.hierarchies:
            if not need_kill and h.kind == "v2" and not self._limits_in(h):
                continue
            path = h.base / token
            try:
                path.mkdir(exist_ok=not limit)
            except OSError as exc:
                log.warning("cannot create cgroup %s: %s", path, exc)
                continue
            dirs.append(path)
        if not dirs:
            return None
        group = CallCgroup(tuple(dirs))
        if limit:
            group.limit(conf, self._limit_files)
        return group

    def relimit(self, group: CallCgroup, conf: Confinement) -> None:
        """Write `conf`'s limits into a leaf made with others."""
        group.limit(conf, self._limit_files)

    def _limits_in(self, h: _Hierarchy) -> bool:
        """Does this hierarchy limit anything (v2 without delegated controllers does not)?"""
        return any((h.base / n).exists() for n in ("pids.max", *_MEMORY_LIMITS))

    def cleanup_stale(self) -> int:
        """Kill and remove leaves left by an earlier daemon with the same id."""
        removed = 0
        leaves = {p.name for h in self.hierarchies for p in _subdirs(h.base)}
        for token in leaves:
            dirs = tuple(h.base / token for h in self.hierarchies if (h.base / token).is_dir())
            group = CallCgroup(dirs)
            group.kill()
            removed += group.remove()
        return removed


class CallCgroup:
    """One call's leaf in each hierarchy."""

    def __init__(self, dirs: tuple[Path, ...]) -> None:
        self.dirs = dirs
        # A memory limit was set here (then the address-space rlimit is not needed).
        self.limits_memory = False
        # pids.max was set here: the per-call process limit (RLIMIT_NPROC counts every
        # process of the uid, so calls sharing a run-as user would share it).
        self.limits_pids = False

    def join_command(self) -> str:
        """Shell text that moves the running shell into every leaf (before it execs)."""
        return "; ".join(f"echo 0 > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self.dirs)

    def limit(self, conf: Confinement, known: dict[Path, tuple[str, ...]]) -> None:
        """Write the limits; `known` caches which limit files a leaf under a base has."""
        values = {
            "pids.max": conf.processes,
            "memory.max": conf.memory_bytes,
            "memory.swap.max": 0,
            "memory.limit_in_bytes": conf.memory_bytes,
            "memory.memsw.limit_in_bytes": conf.memory_bytes,
        }
        for d in self.dirs:
            names = known.get(d.parent)
            if names is None:
                names = known[d.parent] = tuple(n for n in values if (d / n).exists())
            for name in names:
                if _write(d / name, str(values[name])):
                    self.limits_memory |= name in _MEMORY_LIMITS
                    self.limits_pids |= name == "pids.max"

    def procs(self) -> set[int]:
        members: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                members.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return members

    def kill(self) -> str:
        """SIGKILL every member: cgroup.kill where the kernel has it, else member by member."""
        for d in self.dirs:
            if (d / "cgroup.kill").exists() and _write(d / "cgroup.kill", "1"):
                return f"cgroup.kill on {d}"
        # v1: a member may fork while we kill; the pids limit bounds how long that lasts.
        for _ in range(100):
            members = self.procs()
            if not members:
                break
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)
        return f"SIGKILL to every member of {self.dirs[0]}"

    def oom_killed(self) -> bool:
        for d in self.dirs:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError):
                    for line in (d / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill" and value.strip() != "0":
                            return True
        return False

    def try_remove(self) -> bool:
        """One quick rmdir of every leaf (no waiting): True if none is left."""
        left = []
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(d)
        self.dirs = tuple(left)
        return not left

    def remove(self) -> int:
        """rmdir every leaf; a leaf with members left stays (and is logged)."""
        removed = 0
        for d in self.dirs:
            for _ in range(50):  # a killed member leaves the cgroup when it is reaped
                try:
                    d.rmdir()
                    removed += 1
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)
            else:
                log.warning("cgroup %s still has members; left in place", d)
        return removed


def _subdirs(base: Path) -> list[Path]:
    """The leaves under `base`; none if it is gone (an earlier daemon removed it just now)."""
    try:
        return [p for p in base.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return []


def _write(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
        return True
    except OSError as exc:
        log.debug("cannot write %s: %s", path, exc)
        return False


def remove_root(root: CgroupRoot) -> None:
    """rmdir the daemon's own directories (at shutdown; leaves must be gone)."""
    for h in root.hierarchies:
        with contextlib.suppress(OSError):
            h.base.rmdir()
