"""The workspace boundary: every path a tool touches is named and opened here.

Two steps, and the second never trusts the first:

- `resolve` (validation): the argument is joined to the root, `..` and symlinks
  are resolved, and the canonical result must stay inside the root (else REJECTED
  permission_denied). Lock keys and policy decisions use this canonical path.
- the open (run time): the canonical path is opened from the root's descriptor with
  no symlink allowed anywhere (`beneath`: openat2 RESOLVE_BENEATH |
  RESOLVE_NO_SYMLINKS, or an O_NOFOLLOW walk). The canonical path has no symlink
  in it, so one found now was swapped in after validation: refused, never followed.

Regular files with more than one hard link are refused unless the caller says the
policy allows them there (`hard_links:`): another name of the same inode may lie
outside the workspace, and reading or changing it through the inside name would
reach the outside file.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from . import beneath
from .errors import ToolError, invalid
from .outcomes import ErrorClass, Status
from .requests import DEFAULT_WORKSPACE

# Linux's limits: a longer path or component cannot name a file; say so up front
# (REJECTED, naming the field) instead of failing inside a tool.
PATH_MAX = 4096
NAME_MAX = 255
_READ = os.O_RDONLY | os.O_NONBLOCK  # O_NONBLOCK: a FIFO cannot block the open


class Workspace:
    """One root directory a call's tools work in, held open as a descriptor. A daemon
    serves several (pipeline/workspaces.py); each call works in exactly one."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        owner: tuple[int, int] | None = None,
        name: str = DEFAULT_WORKSPACE,
    ):
        self.root = Path(os.path.realpath(root))
        # What calls and the journal call it (the policy's `workspaces:` name).
        self.name = name
        # Its lock keys' workspace component (locks.keys): the canonical root, so two
        # names for one directory share their locks.
        self.lock_root = str(self.root)
        # (uid, gid) that files and directories the tools create are given to, when
        # the daemon runs as root and commands run as that user; None: left as made.
        self.owner = owner
        self.fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def contains(self, real: str) -> bool:
        root = str(self.root)
        return real == root or real.startswith(root + os.sep)

    def resolve(self, raw: str, field: str) -> Path:
        """Canonical absolute path for `raw`, guaranteed inside the workspace."""
        check_name(raw, field)
        try:
            real = os.path.realpath(os.path.join(self.root, raw))
        except OSError as exc:  # a component changed between realpath's lstat and readlink
            raise ToolError(
                ErrorClass.PERMISSION_DENIED,
                f"{raw!r} changed while it was resolved: {exc.strerror}",
                field=field,
                status=Status.REJECTED,
            ) from exc
        if not self.contains(real):
            raise ToolError(
                ErrorClass.PERMISSION_DENIED,
                f"{raw!r} resolves outside the workspace",
                field=field,
                status=Status.REJECTED,
            )
        if len(os.fsencode(real)) > PATH_MAX:
            raise invalid(f"path resolves to more than {PATH_MAX} bytes", field)
        return Path(real)

    @staticmethod
    def canonical(path: Path) -> Path | None:
        """`path` with its symlinks resolved; None if a component changed while resolving
        (a symlink replaced between realpath's lstat and its readlink)."""
        try:
            return Path(os.path.realpath(path))
        except OSError:
            return None

    def relative(self, path: Path) -> str:
        rel = os.path.relpath(path, self.root)
        return "." if rel == "." else rel

    def _beneath(self, path: Path, field: str) -> str:
        rel = self.relative(path)
        if rel == ".." or rel.startswith("../") or os.path.isabs(rel):
            raise ToolError(
                ErrorClass.PERMISSION_DENIED, f"{path} is outside the workspace", field=field
            )
        return rel

    # -- opening --------------------------------------------------------------------

    def open(self, path: Path, flags: int, field: str, mode: int = 0o600) -> int:
        """Open `path` (canonical, inside) with `flags`; typed errors naming `field`."""
        try:
            return beneath.open_beneath(self.fd, self._beneath(path, field), flags, mode)
        except OSError as exc:
            raise _typed(exc, path, field) from exc

    def open_file(self, path: Path, field: str, *, hard_links_ok: bool = False) -> int:
        """Open an existing regular file for reading; anything else is refused."""
        fd = self.open(path, _READ, field)
        try:
            self.check_regular(fd, path, field, hard_links_ok=hard_links_ok)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def check_regular(self, fd: int, path: Path, field: str, *, hard_links_ok: bool) -> None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ToolError(ErrorClass.INVALID_ARGUMENT, f"{path} is {what}", field=field)
        if st.st_nlink > 1 and not hard_links_ok:
            raise hard_link_refused(self.relative(path), st.st_nlink, field)

    def open_dir(self, path: Path, field: str) -> int:
        return self.open(path, os.O_RDONLY | os.O_DIRECTORY, field)

    def open_parent(self, path: Path, field: str, *, create: bool) -> tuple[int, str]:
        """The directory holding `path` (created, component by component, if `create`)
        and the name `path` has in it."""
        rel = self._beneath(path, field)
        if rel == ".":
            raise ToolError(ErrorClass.INVALID_ARGUMENT, "the workspace root itself", field=field)
        head, _, name = rel.rpartition("/")
        try:
            if create:
                return beneath.make_dirs(self.fd, head, self.owner), name
            return beneath.open_beneath(self.fd, head, os.O_RDONLY | os.O_DIRECTORY), name
        except OSError as exc:
            raise _typed(exc, path.parent, field, parent=True) from exc

    def lstat(self, path: Path, field: str) -> os.stat_result | None:
        """What is at `path` now, without following it (None: nothing)."""
        try:
            fd = beneath.open_beneath(self.fd, self._beneath(path, field), os.O_PATH)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _typed(exc, path, field) from exc
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)


def check_name(raw: str, field: str) -> None:
    """Refuse a path argument no file can have, before anything looks it up."""
    if "\x00" in raw:
        raise invalid("path contains a NUL byte", field)
    if raw == "":
        raise invalid("path is empty", field)
    try:
        encoded = os.fsencode(raw)
    except UnicodeEncodeError:
        raise invalid("path is not valid Unicode", field) from None
    if len(encoded) > PATH_MAX:
        raise invalid(f"path is {len(encoded)} bytes; the limit is {PATH_MAX}", field)
    longest = max((len(p) for p in encoded.split(b"/")), default=0)
    if longest > NAME_MAX:
        raise invalid(f"a path component is {longest} bytes; the limit is {NAME_MAX}", field)


def hard_link_refused(rel: str, links: int, field: str) -> ToolError:
    return ToolError(
        ErrorClass.PERMISSION_DENIED,
        f"{rel} has {links} hard links: another name of this file may be outside the "
        "workspace, so it is treated as outside (a policy `hard_links:` entry allows "
        "hard-linked files under chosen paths)",
        field=field,
    )


def _typed(exc: OSError, path: Path, field: str, *, parent: bool = False) -> ToolError:
    """The kernel's refusal as the call's typed error."""
    what = f"a parent of {path}" if parent else str(path)
    match exc.errno:
        case errno.ENOENT:
            return ToolError(ErrorClass.NOT_FOUND, f"{what} does not exist", field=field)
        case errno.ELOOP | errno.EXDEV:
            return ToolError(
                ErrorClass.PERMISSION_DENIED,
                f"{what} is or became a symlink (or left the workspace) while the call ran; "
                "not followed",
                field=field,
            )
        case errno.ENOTDIR:
            return ToolError(
                ErrorClass.INVALID_ARGUMENT, f"{what}: a component is not a directory", field=field
            )
        case errno.EISDIR:
            return ToolError(ErrorClass.INVALID_ARGUMENT, f"{what} is a directory", field=field)
        case errno.EACCES | errno.EPERM:
            return ToolError(
                ErrorClass.PERMISSION_DENIED, f"{what}: permission denied", field=field
            )
        case errno.ENAMETOOLONG:
            return ToolError(ErrorClass.INVALID_ARGUMENT, f"{what}: name too long", field=field)
        case _:
            return ToolError(ErrorClass.IO_ERROR, f"{what}: {exc.strerror}", field=field)
