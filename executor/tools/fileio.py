"""Blocking file primitives shared by the file tools (run in worker threads)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from ..errors import ToolError
from ..outcomes import ErrorClass
from ..paths import Workspace


def read_all(ws: Workspace, path: Path, field: str) -> bytes:
    fd = ws.open_file(path, field)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def existing_hash(ws: Workspace, path: Path, field: str) -> str:
    """sha256 of the file now at `path`, or "" when there is none."""
    if not path.exists():
        return ""
    return sha256(read_all(ws, path, field))


class WriteAbandoned(Exception):
    """The write was stopped before its rename: the target is untouched."""


def atomic_write(
    ws: Workspace,
    path: Path,
    data: bytes,
    field: str,
    *,
    make_dirs: bool,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Replace `path` with `data` so a reader sees the old file or the new, never half.

    Temp file in the same directory, fsync, rename over the target, fsync the
    directory. Until the rename nothing visible has changed, which is why an
    interrupted built-in write is a known FAILURE and not UNKNOWN_OUTCOME: if
    `stop()` is true just before the rename, the temp file is removed and
    WriteAbandoned raised.
    """
    if path.is_dir():
        raise ToolError(ErrorClass.INVALID_ARGUMENT, f"{path} is a directory", field=field)
    if make_dirs:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise ToolError(
                ErrorClass.INVALID_ARGUMENT,
                f"{path.parent}: a parent is not a directory",
                field=field,
            ) from exc
        except OSError as exc:
            raise ToolError(
                ErrorClass.IO_ERROR, f"{path.parent}: {exc.strerror}", field=field
            ) from exc
    dir_fd = ws.open_dir(path.parent, field)
    try:
        mode = _existing_mode(path)
        tmp = f".{path.name}.execgate-{secrets.token_hex(6)}.tmp"
        _write_temp(dir_fd, tmp, data, mode)
        if stop():
            os.unlink(tmp, dir_fd=dir_fd)
            raise WriteAbandoned(str(path))
        try:
            os.rename(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    except OSError as exc:
        raise ToolError(ErrorClass.IO_ERROR, f"{path}: {exc.strerror}", field=field) from exc
    finally:
        os.close(dir_fd)


def _existing_mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o644


def _write_temp(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    os.close(fd)
