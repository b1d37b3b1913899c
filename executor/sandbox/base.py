"""The sandbox interface: how a process-based tool is started, stopped and cleaned up.

A backend (`process`, `bwrap`, `docker`) turns a `Launch` into a `Running`
handle. The handle can ask politely (`terminate`), force (`kill`: everything the
call started, grandchildren that left the process group included), and prove the
result (`survivors`). The cancellation ladder in `sandbox/ladder.py` drives these
steps the same way for every backend, so what "stopped" means does not depend on
where the call ran.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from execgate.executor.core import ranges
from execgate.executor.core.errors import ExecgateError

# Every process a call starts carries this variable (unless it clears its own
# environment): the last-resort sweep and the tests find a call's processes by it.
MARKER_ENV = "EXECGATE_CALL"


@dataclass(frozen=True, slots=True, kw_only=True)
class Confinement:
    """Resource limits and permissions of one sandboxed call."""

    cpu_seconds: int = 600
    # Address space (rlimit) for process/bwrap; the memory (= memory+swap) limit of a
    # cgroup or container.
    memory_bytes: int = 2 << 30
    file_size_bytes: int = 1 << 30
    open_files: int = 1024
    processes: int = 256
    network: bool = False


def fit_confinement(conf: Confinement) -> tuple[Confinement, list[str]]:
    """The daemon's built-in limits lowered to this host's ceilings (they are no flag an
    operator could fix), and what was lowered."""
    notes = []
    for f in ranges.RLIMITS:
        if getattr(conf, f) > (top := ranges.ceiling(f)):
            notes.append(f"{f} {getattr(conf, f)} -> {top} (this host's hard limit)")
            conf = replace(conf, **{f: top})  # type: ignore[arg-type]  # an int field
    return conf, notes


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    argv: tuple[str, ...]
    # Absolute host path inside the workspace.
    cwd: Path
    env: dict[str, str]
    stdin: bytes | None
    workspace: Path
    # The workspace is bound read-write (a tool that may write) or read-only.
    writable: bool
    # With `writable` False: these (canonical, existing, inside the workspace) are bound
    # read-write over the read-only workspace -- a command's declared writes. Backends
    # with `confines_writes` honour them; `process` cannot, and is never given any.
    write_paths: tuple[Path, ...] = ()
    # Unique per call; exported as MARKER_ENV.
    marker: str
    confinement: Confinement = field(default_factory=Confinement)
    # Keep at most this many bytes of stdout and of stderr (the rest is counted).
    output_cap: int = 1 << 20
    # The run the call belongs to: a backend may share warm state within it (docker).
    run_id: str = ""
    # A long-lived server (an MCP server over stdio): stdin and stdout stay open as the
    # caller's streams (`Serving.stdio`), only stderr is captured (`output_cap` bytes).
    # The backend also ties the process to the daemon's life (no orphan on SIGKILL).
    serve: bool = False
    # The image of a container backend ("": the backend's own, --docker-image); the
    # other backends run host programs and never see it (the caller refuses the mix).
    image: str = ""


@dataclass(frozen=True, slots=True)
class Exit:
    code: int | None
    signal: int | None = None
    oom_killed: bool = False
    # Wall-clock time the main process was seen to end, when the backend knows it
    # sooner than its exit status arrives (dockerd reports a container's exit tens
    # of ms after its init is gone); None: when `wait` returned.
    at: float | None = None


@dataclass(frozen=True, slots=True)
class Captured:
    data: bytes = b""
    total: int = 0
    # When the call had stopped, some process still held this pipe open: one the
    # sandbox could not find (it left its cgroup and cleared its marker).
    held_open: bool = False

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)


@dataclass(frozen=True, slots=True)
class Probe:
    """What `execgate doctor` prints for one backend."""

    name: str
    ok: bool
    detail: str


class SandboxError(ExecgateError):
    """The sandbox could not start the call (not: the call failed); `message` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Running(Protocol):
    # How the call is contained, for the timeline ("pid namespace 4026532", ...).
    description: str

    async def wait(self) -> Exit:
        """Until the call's main process has exited."""
        ...

    async def finish(self) -> None:
        """The main process has exited: end whatever it left behind (background children)."""
        ...

    async def terminate(self) -> str:
        """The polite signal (SIGTERM); returns what was signalled."""
        ...

    async def kill(self) -> str:
        """Force-terminate everything the call started; returns how."""
        ...

    async def survivors(self) -> list[int]:
        """Host pids of the call's processes that are still alive."""
        ...

    async def output(self) -> tuple[Captured, Captured]:
        """stdout and stderr, once the call has stopped."""
        ...

    async def release(self) -> None:
        """Remove what the sandbox left (cgroups, containers). Idempotent."""
        ...


@runtime_checkable
class Serving(Running, Protocol):
    """A `Running` started with `Launch.serve`: the server's stdin and stdout."""

    def stdio(self) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
        """The server's stdin (to write to) and stdout (to read from)."""
        ...


class Sandbox(Protocol):
    name: str
    # Can it keep the workspace read-only but for `Launch.write_paths`? Only then is a
    # command's declaration of what it writes believed (its locks narrowed to it).
    confines_writes: bool

    async def start(self, launch: Launch) -> Running:
        """Start the call; raises SandboxError when the sandbox itself fails."""
        ...

    def probe(self) -> Probe:
        """Does this backend work on this machine? (Blocking; `execgate doctor`.)"""
        ...

    async def cleanup_stale(self) -> int:
        """Remove what a crashed daemon left; returns how many things were removed."""
        ...

    async def close(self) -> None:
        """Daemon shutdown: release shared resources (warm containers)."""
        ...

    def run_ended(self, run_id: str) -> None:
        """The run ended: what was kept warm for it may go (now, or after its last call)."""
        ...
