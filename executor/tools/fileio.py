"""Blocking file primitives shared by the file tools (run in worker threads).

Everything goes through the workspace's descriptor-relative opens (`paths`,
`beneath`): the directory a file is written in is opened once, no-follow, and
the temp file, the rename and the fsync all happen relative to that descriptor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from execgate.executor.core.errors import ExecgateError, ToolError
from execgate.executor.core.outcomes import ErrorClass
from execgate.executor.core.paths import Workspace, hard_link_refused

from . import dirsync

T = TypeVar("T")


def read_all(ws: Workspace, path: Path, field: str, *, cap: int, hard_links_ok: bool) -> bytes:
    """The whole file, refused (resource_exhausted) when it is larger than `cap` bytes."""
    fd = ws.open_file(path, field, hard_links_ok=hard_links_ok)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > cap:
            raise too_large(ws.relative(path), size, cap, field)
        data = fh.read(cap + 1)
    if len(data) > cap:  # it grew while it was read
        raise too_large(ws.relative(path), len(data), cap, field)
    return data


def too_large(rel: str, size: int, cap: int, field: str) -> ToolError:
    return ToolError(
        ErrorClass.RESOURCE_EXHAUSTED,
        f"{rel} would be {size} bytes; the file tools' limit is {cap} bytes "
        "(the policy's limits: file_cap_kb, the daemon's --file-cap)",
        field=field,
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Durable writes spend most of their time blocked in fsync (and, gated, on their intent's
# commit), using no CPU: a pool of their own, wider than asyncio's default one (cpu + 4
# threads, shared with every other blocking call), lets concurrent writers overlap their
# fsyncs -- where the kernel batches them -- instead of queueing behind a few threads.
WRITERS = 32
_writers = concurrent.futures.ThreadPoolExecutor(WRITERS, thread_name_prefix="file-write")


async def in_writer_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """`fn(*args)` on a thread of the writers' pool (with the caller's context, as
    asyncio.to_thread)."""
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_writers, ctx.run, fn, *args)


class WriteAbandoned(ExecgateError):
    """The write of `path` was stopped before its rename: the target is untouched."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.path = path


@dataclass(frozen=True, slots=True)
class Replaced:
    """What stood at the target before the write (sha256 "" and created: nothing)."""

    sha256_before: str
    created: bool


def atomic_write(
    ws: Workspace,
    path: Path,
    data: bytes,
    field: str,
    *,
    make_dirs: bool,
    hard_links_ok: bool,
    stop: Callable[[], bool] = lambda: False,
    before_effect: Callable[[], None] = lambda: None,
) -> Replaced:
    """Replace `path` with `data` so a reader sees the old file or the new, never half.

    The new content is staged in an unnamed file (O_TMPFILE) of the target's
    directory and fsync'd: nothing anyone can see, so it may overlap the call's
    durable intent. `before_effect()` (blocking until the intent is committed) comes
    before the first visible step: a missing parent directory made, the staged file
    linked under a temp name, renamed over the target, the directory fsync'd. All
    relative to one no-follow descriptor of that directory, so a component swapped
    for a symlink meanwhile cannot redirect any step. Where O_TMPFILE is not
    supported, the temp file is written under its name after `before_effect()`.

    Until the rename nothing visible has changed, which is why an interrupted built-in
    write is a known FAILURE and not UNKNOWN_OUTCOME: if `stop()` is true just before
    the rename, the temp file is removed and WriteAbandoned raised.
    """
    dir_fd, name, gated = _parent(ws, path, field, make_dirs, before_effect)
    try:
        before = _before(ws, dir_fd, name, path, field, hard_links_ok)
        owner = before.owner if before.exists else ws.owner
        tmp = f".{name}.execgate-{secrets.token_hex(6)}.tmp"
        staged = _stage(dir_fd, data, before.mode, owner)
        try:
            if stop():  # nothing visible yet: the staged file goes with its descriptor
                raise WriteAbandoned(path)
            if not gated:
                before_effect()
            if staged is None or not _link(staged, dir_fd, tmp):
                _write_temp(dir_fd, tmp, data, before.mode, owner)
        finally:
            if staged is not None:
                os.close(staged)
        _replace_with(dir_fd, tmp, name, path, stop)
    except OSError as exc:
        raise ToolError(ErrorClass.IO_ERROR, f"{path}: {exc.strerror}", field=field) from exc
    finally:
        os.close(dir_fd)
    return Replaced(before.sha256, not before.exists)


def _parent(
    ws: Workspace, path: Path, field: str, make_dirs: bool, before_effect: Callable[[], None]
) -> tuple[int, str, bool]:
    """The target's directory, its name there, and whether `before_effect` was called:
    a directory that has to be made is a visible effect, so it waits for the intent."""
    try:
        return (*ws.open_parent(path, field, create=False), False)
    except ToolError:
        if not make_dirs:
            raise
    before_effect()
    return (*ws.open_parent(path, field, create=True), True)


def _replace_with(dir_fd: int, tmp: str, name: str, path: Path, stop: Callable[[], bool]) -> None:
    """Rename the temp file over the target (unless `stop()`), then fsync the directory
    (one fsync begun after the rename, maybe another writer's: dirsync)."""
    if stop():
        os.unlink(tmp, dir_fd=dir_fd)
        raise WriteAbandoned(path)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    dirsync.sync(dir_fd)  # shared with concurrent writes in the same directory


def _stage(dir_fd: int, data: bytes, mode: int, owner: tuple[int, int] | None) -> int | None:
    """An unnamed file in the directory holding `data`, fsync'd (its descriptor), or
    None where the filesystem has no O_TMPFILE."""
    try:
        fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise
    try:
        _fill(fd, data, mode, owner)
    except BaseException:
        os.close(fd)  # unnamed: closing it is all there is to remove
        raise
    return fd


def _link(fd: int, dir_fd: int, name: str) -> bool:
    """Give the staged file `name`; False if /proc is not there to name it through."""
    try:
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
    except FileNotFoundError:
        if os.path.exists(f"/proc/self/fd/{fd}"):
            raise  # the directory itself is gone
        return False
    return True


@dataclass(frozen=True, slots=True)
class _Before:
    exists: bool
    sha256: str = ""
    mode: int = 0o644
    owner: tuple[int, int] | None = None


def _before(
    ws: Workspace, dir_fd: int, name: str, path: Path, field: str, hard_links_ok: bool
) -> _Before:
    """The file being replaced, read through the directory's descriptor (no follow)."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except FileNotFoundError:
        return _Before(exists=False)
    except IsADirectoryError as exc:
        raise ToolError(ErrorClass.INVALID_ARGUMENT, f"{path} is a directory", field=field) from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink stands where the canonical file was
            raise ToolError(
                ErrorClass.PERMISSION_DENIED,
                f"{path} became a symlink while the call ran; not followed",
                field=field,
            ) from exc
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ToolError(ErrorClass.INVALID_ARGUMENT, f"{path} is {what}", field=field)
    with os.fdopen(fd, "rb", buffering=0) as fh:
        if st.st_nlink > 1 and not hard_links_ok:
            raise hard_link_refused(ws.relative(path), st.st_nlink, field)
        digest = _digest(fh.fileno())
    # Set-id bits are not carried over: new content must not inherit a privilege.
    return _Before(True, digest, st.st_mode & 0o777, (st.st_uid, st.st_gid))


def _digest(fd: int) -> str:
    """sha256 of the rest of the file. Not hashlib.file_digest: it allocates a 256 KiB
    buffer per call, which is most of the cost for the small files agents write."""
    h = hashlib.sha256()
    while chunk := os.read(fd, _CHUNK):
        h.update(chunk)
    return h.hexdigest()


_CHUNK = 64 * 1024


def _write_temp(
    dir_fd: int, name: str, data: bytes, mode: int, owner: tuple[int, int] | None
) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    try:
        _fill(fd, data, mode, owner)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    os.close(fd)


def _fill(fd: int, data: bytes, mode: int, owner: tuple[int, int] | None) -> None:
    """Write `data`, set owner and mode, fsync."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    if owner is not None and os.geteuid() == 0:
        os.fchown(fd, *owner)
    os.fchmod(fd, mode)  # after fchown, which clears set-id bits
    os.fsync(fd)
