"""The workspace boundary: every path a tool touches is resolved here.

A path argument is joined to the workspace root, `..` and symlinks are resolved,
and the result must stay inside the root. Anything else is REJECTED with
permission_denied and never followed. Files are then opened by the resolved path
with O_NOFOLLOW, and the opened descriptor is checked again through /proc, so a
symlink swapped in between the check and the open cannot lead outside either.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import ToolError, invalid
from .outcomes import ErrorClass, Status

_PROC_FD = Path("/proc/self/fd")


class Workspace:
    """The root directory all tools work in."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.realpath(root))

    def contains(self, real: str) -> bool:
        root = str(self.root)
        return real == root or real.startswith(root + os.sep)

    def resolve(self, raw: str, field: str) -> Path:
        """Canonical absolute path for `raw`, guaranteed inside the workspace."""
        if "\x00" in raw:
            raise invalid("path contains a NUL byte", field)
        if raw == "":
            raise invalid("path is empty", field)
        real = os.path.realpath(os.path.join(self.root, raw))
        if not self.contains(real):
            raise ToolError(
                ErrorClass.PERMISSION_DENIED,
                f"{raw!r} resolves outside the workspace",
                field=field,
                status=Status.REJECTED,
            )
        return Path(real)

    def relative(self, path: Path) -> str:
        rel = os.path.relpath(path, self.root)
        return "." if rel == "." else rel

    def check_fd(self, fd: int, field: str) -> None:
        """Refuse a descriptor whose real path is outside the workspace."""
        real = os.readlink(_PROC_FD / str(fd))
        if not self.contains(real):
            os.close(fd)
            raise ToolError(
                ErrorClass.PERMISSION_DENIED,
                "path changed to point outside the workspace while it was opened",
                field=field,
            )

    def open_file(self, path: Path, field: str) -> int:
        """Open an existing regular file for reading.

        O_NONBLOCK so that a FIFO cannot block the open forever (it has no
        effect on reading a regular file); anything but a regular file is refused.
        """
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        fd = _os_open(path, flags, field)
        self.check_fd(fd, field)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise ToolError(ErrorClass.INVALID_ARGUMENT, f"{path} is {what}", field=field)
        return fd

    def open_dir(self, path: Path, field: str) -> int:
        fd = _os_open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, field)
        self.check_fd(fd, field)
        return fd


def _os_open(path: Path, flags: int, field: str) -> int:
    try:
        return os.open(path, flags)
    except FileNotFoundError as exc:
        raise ToolError(ErrorClass.NOT_FOUND, f"{path} does not exist", field=field) from exc
    except NotADirectoryError as exc:
        raise ToolError(
            ErrorClass.INVALID_ARGUMENT, f"{path} is not a directory", field=field
        ) from exc
    except IsADirectoryError as exc:
        raise ToolError(ErrorClass.INVALID_ARGUMENT, f"{path} is a directory", field=field) from exc
    except PermissionError as exc:
        raise ToolError(
            ErrorClass.PERMISSION_DENIED, f"{path}: permission denied", field=field
        ) from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ToolError(
                ErrorClass.PERMISSION_DENIED, f"{path} became a symlink", field=field
            ) from exc
        raise ToolError(ErrorClass.IO_ERROR, f"{path}: {exc.strerror}", field=field) from exc
