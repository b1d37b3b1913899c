"""Blocking file primitives shared by the file tools (run in worker threads).

Everything goes through the workspace's descriptor-relative opens (`paths`,
`beneath`): the directory a file is written in is opened once, no-follow, and
the temp file, the rename and the fsync all happen relative to that descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from execgate.executor.core.errors import ExecgateError, ToolError
from execgate.executor.core.outcomes import ErrorClass
from execgate.executor.core.paths import Workspace, hard_link_refused


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
) -> Replaced:
    """Replace `path` with `data` so a reader sees the old file or the new, never half.

    Temp file in the target's directory, fsync, rename over the target, fsync the
    directory -- all relative to one no-follow descriptor of that directory, so a
    component swapped for a symlink meanwhile cannot redirect any step. Until the
    rename nothing visible has changed, which is why an interrupted built-in write
    is a known FAILURE and not UNKNOWN_OUTCOME: if `stop()` is true just before the
    rename, the temp file is removed and WriteAbandoned raised.
    """
    dir_fd, name = ws.open_parent(path, field, create=make_dirs)
    try:
        before = _before(ws, dir_fd, name, path, field, hard_links_ok)
        owner = before.owner if before.exists else ws.owner
        tmp = f".{name}.execgate-{secrets.token_hex(6)}.tmp"
        _write_temp(dir_fd, tmp, data, before.mode, owner)
        if stop():
            os.unlink(tmp, dir_fd=dir_fd)
            raise WriteAbandoned(path)
        try:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    except OSError as exc:
        raise ToolError(ErrorClass.IO_ERROR, f"{path}: {exc.strerror}", field=field) from exc
    finally:
        os.close(dir_fd)
    return Replaced(before.sha256, not before.exists)


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
    with os.fdopen(fd, "rb") as fh:
        if st.st_nlink > 1 and not hard_links_ok:
            raise hard_link_refused(ws.relative(path), st.st_nlink, field)
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    # Set-id bits are not carried over: new content must not inherit a privilege.
    return _Before(True, digest, st.st_mode & 0o777, (st.st_uid, st.st_gid))


def _write_temp(
    dir_fd: int, name: str, data: bytes, mode: int, owner: tuple[int, int] | None
) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if owner is not None and os.geteuid() == 0:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)  # after fchown, which clears set-id bits
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    os.close(fd)
