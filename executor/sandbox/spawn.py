"""Starting a host process for the `process` and `bwrap` backends, and reading its output.

No `preexec_fn` (unsafe in a threaded server): the child gets its own session
from `start_new_session` (done in C by subprocess), and its cgroup leaves and
rlimits from one `dash -c` that writes itself into the leaves, sets the limits
with `ulimit` (soft = hard) and execs the command. Without dash, a POSIX `sh`
joins the leaves and util-linux `prlimit` sets the limits (one more exec: ulimit's
flags and units differ between shells, so only dash's are relied on). Each link
of the chain execs the next, so the pid we hold is the command's own (or bwrap's).
The process backend adds one more link before the command: `setpriv`, which
drops the daemon's uid, groups and capabilities (privileges.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path
from typing import Protocol

from .base import Captured, Confinement, SandboxError
from .cgroup import CallCgroup

PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"
DASH = shutil.which("dash")


def launcher(conf: Confinement, group: CallCgroup | None) -> list[str]:
    """The exec chain that puts the command into its cgroup leaves and under its limits."""
    if DASH is None:
        return [*cgroup_prefix(group), *rlimit_prefix(conf, group)]
    steps = ["set -e"]
    if group is not None:
        steps.append(group.join_command())
    # dash: -t seconds, -v KiB, -f 512-byte blocks, -n files, -p processes. Memory is
    # the cgroup's limit where there is one (resident memory, as docker's): an
    # address-space limit also refuses runtimes that only reserve address space.
    steps.append(f"ulimit -t {conf.cpu_seconds}")
    if group is None or not group.limits_memory:
        steps.append(f"ulimit -v {conf.memory_bytes // 1024}")
    steps += [f"ulimit -f {conf.file_size_bytes // 512}", f"ulimit -n {conf.open_files}"]
    if group is None or not group.limits_pids:
        steps.append(f"ulimit -p {conf.processes}")
    steps.append('exec "$@"')
    return [DASH, "-c", "; ".join(steps), "sh"]


def rlimit_prefix(conf: Confinement, group: CallCgroup | None = None) -> list[str]:
    """`prlimit` setting soft = hard limits, then `--` and the command."""
    memory = [] if group is not None and group.limits_memory else [f"--as={conf.memory_bytes}"]
    # Per real uid, not per call, and not enforced for root: the cgroup's pids.max
    # is the per-call limit where cgroups are available.
    nproc = [] if group is not None and group.limits_pids else [f"--nproc={conf.processes}"]
    return [
        PRLIMIT,
        f"--cpu={conf.cpu_seconds}",
        *memory,
        f"--fsize={conf.file_size_bytes}",
        f"--nofile={conf.open_files}",
        *nproc,
        "--",
    ]


def cgroup_prefix(group: CallCgroup | None) -> list[str]:
    if group is None:
        return []
    return ["/bin/sh", "-c", group.join_command() + '; exec "$@"', "sh"]


async def spawn(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdin: bytes | None,
    pass_fds: tuple[int, ...] = (),
    serve: bool = False,
) -> asyncio.subprocess.Process:
    """`serve`: a long-lived server whose stdin stays a pipe the caller writes to."""
    piped = stdin is not None or serve
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            pass_fds=pass_fds,
            start_new_session=True,
            # A server's messages may be long lines: no readline limit applies to ours.
            limit=1 << 20,
            stdin=asyncio.subprocess.PIPE if piped else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {argv[0]}: {exc.strerror}") from exc


class Streams(Protocol):
    """A child's pipes: an asyncio subprocess, or the pipes a warm sandbox's call got."""

    @property
    def stdin(self) -> asyncio.StreamWriter | None: ...

    @property
    def stdout(self) -> asyncio.StreamReader | None: ...

    @property
    def stderr(self) -> asyncio.StreamReader | None: ...


class Pipes:
    """Drains stdout and stderr (keeping `cap` bytes of each) and feeds stdin.

    `serve`: stdin and stdout belong to the caller (a server's protocol streams);
    only stderr is drained, and `result` reports an empty stdout."""

    def __init__(
        self,
        proc: Streams,
        stdin: bytes | None,
        cap: int,
        *,
        serve: bool = False,
    ) -> None:
        assert proc.stdout is not None
        assert proc.stderr is not None
        self._sinks = (Sink(cap), Sink(cap))
        self._tasks = [
            asyncio.ensure_future(_drain(proc.stderr, self._sinks[1])),
        ]
        if not serve:
            self._tasks.insert(0, asyncio.ensure_future(_drain(proc.stdout, self._sinks[0])))
        else:
            self._sinks = (Sink(0), self._sinks[1])
            stdin = None
        self._feeder = asyncio.ensure_future(_feed(proc, stdin)) if stdin is not None else None

    async def result(self, settle: float) -> tuple[Captured, Captured]:
        """What was read, once both pipes closed or `settle` seconds passed; a pipe still
        open then is reported `held_open` (with what it gave so far)."""
        await asyncio.wait(self._tasks, timeout=settle)
        held = [not task.done() for task in self._tasks]
        if len(held) == 1:  # serving: stdout was the caller's
            held.insert(0, False)
        out, err = (sink.captured(held_open=h) for sink, h in zip(self._sinks, held, strict=True))
        self.cancel()
        return out, err

    def cancel(self) -> None:
        for task in (*self._tasks, self._feeder):
            if task is not None:
                task.cancel()


class Sink:
    """The first `cap` bytes of an output stream, and how many there were in all."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if len(self.kept) < self.cap:
            self.kept += chunk[: self.cap - len(self.kept)]

    def captured(self, *, held_open: bool = False) -> Captured:
        return Captured(bytes(self.kept), self.total, held_open)


async def _drain(stream: asyncio.StreamReader, sink: Sink) -> None:
    while chunk := await stream.read(65536):
        sink.add(chunk)


async def _feed(proc: Streams, data: bytes) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data)
        await proc.stdin.drain()
    proc.stdin.close()
