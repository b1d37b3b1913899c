"""Opening paths beneath a directory descriptor, never following a symlink.

Every file the daemon's own tools touch is reached from the workspace root's
descriptor, and no name is looked up twice:

- `openat2(root_fd, path, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`
  where the kernel has it (Linux 5.6+): the kernel walks the path and refuses any
  symlink and any step out of the root, atomically;
- elsewhere (an older kernel, or a seccomp filter that refuses openat2): a walk of
  `openat(dir_fd, component, O_NOFOLLOW)`, one component at a time, each one opened
  relative to the descriptor of the one before.

Either way a component swapped for a symlink between a check and the use is
refused (ELOOP), not followed: the check-then-use race of path checks made by
name. Callers pass canonical relative paths (`Workspace.resolve` resolved the
symlinks that were there when the call was validated); this module refuses
`.`, `..` and empty components instead of interpreting them.

Errors are the kernel's, as OSError: ELOOP (a symlink on the way), EXDEV (an
escape openat2 caught), ENOENT, ENOTDIR, EACCES, ... `Workspace` names them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

# linux/openat2.h
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
# The same number on every architecture (the unified syscall table).
_SYS_OPENAT2 = 437
# Forces the component walk even where openat2 works: the tests run both paths.
NO_OPENAT2_ENV = "EXECGATE_NO_OPENAT2"
_DIR = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _openat2(dir_fd: int, path: str, flags: int, mode: int) -> int:
    # openat2 refuses a mode without O_CREAT or O_TMPFILE (which includes O_DIRECTORY).
    creates = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE
    how = _OpenHow(flags, mode if creates else 0, _RESOLVE)
    fd = _syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def _probe() -> bool:
    if os.environ.get(NO_OPENAT2_ENV) == "1":
        return False
    try:
        root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.close(_openat2(root, ".", os.O_PATH | os.O_CLOEXEC, 0))
    except OSError:  # ENOSYS (old kernel), EPERM (seccomp), EINVAL, ...
        return False
    finally:
        os.close(root)
    return True


HAVE_OPENAT2 = _probe()


def parts_of(rel: str) -> list[str]:
    """The components of a canonical relative path ("" or "." is the root itself)."""
    if rel in ("", "."):
        return []
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, "not a canonical relative path", rel)
    return parts


def open_beneath(root_fd: int, rel: str, flags: int, mode: int = 0o600) -> int:
    """Open `rel` below `root_fd` with `flags`; no symlink anywhere on the way.

    O_NOFOLLOW and O_CLOEXEC are always added. With O_PATH | O_NOFOLLOW a trailing
    symlink is opened itself (as openat2 does), so a caller can see what it is.
    """
    parts = parts_of(rel)
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if HAVE_OPENAT2:
        return _openat2(root_fd, "/".join(parts) or ".", flags, mode)
    if not parts:
        return os.open(".", flags, mode, dir_fd=root_fd)
    parent = _walk(root_fd, parts[:-1])
    try:
        return os.open(parts[-1], flags, mode, dir_fd=parent)
    finally:
        if parent != root_fd:
            os.close(parent)


def open_parent(root_fd: int, rel: str) -> tuple[int, str]:
    """The directory holding `rel` (opened O_RDONLY, for *at calls and fsync) and its name."""
    parts = parts_of(rel)
    if not parts:
        raise OSError(errno.EINVAL, "the root has no parent inside the root", rel)
    return open_beneath(root_fd, "/".join(parts[:-1]), os.O_RDONLY | os.O_DIRECTORY), parts[-1]


def make_dirs(root_fd: int, rel: str, owner: tuple[int, int] | None = None) -> int:
    """Open the directory `rel`, creating what is missing one component at a time.

    Each component is created with mkdirat relative to its parent's descriptor and
    then opened O_NOFOLLOW: one swapped for a symlink in between is refused. New
    directories are given to `owner` (uid, gid) when set. Returns the last one,
    opened O_RDONLY.
    """
    current = root_fd
    try:
        for name in parts_of(rel):
            try:
                following = os.open(name, os.O_RDONLY | _DIR, dir_fd=current)
            except FileNotFoundError:
                following = _make_one(current, name, owner)
            except NotADirectoryError:
                _raise_if_symlink(current, name)
                raise
            if current != root_fd:
                os.close(current)
            current = following
        if current == root_fd:
            return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root_fd)
        return current
    except BaseException:
        if current != root_fd:
            os.close(current)
        raise


def _make_one(parent: int, name: str, owner: tuple[int, int] | None) -> int:
    try:
        os.mkdir(name, 0o777, dir_fd=parent)
    except FileExistsError:
        pass  # made meanwhile by someone else: the no-follow open below decides
    else:
        if owner is not None:
            os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)
    try:
        return os.open(name, os.O_RDONLY | _DIR, dir_fd=parent)
    except NotADirectoryError:
        _raise_if_symlink(parent, name)
        raise


def _walk(root_fd: int, parts: list[str]) -> int:
    """The directory at `parts` below `root_fd`, each component opened O_NOFOLLOW."""
    current = root_fd
    try:
        for name in parts:
            try:
                following = os.open(name, os.O_RDONLY | _DIR, dir_fd=current)
            except NotADirectoryError:
                _raise_if_symlink(current, name)
                raise
            if current != root_fd:
                os.close(current)
            current = following
        return current
    except BaseException:
        if current != root_fd:
            os.close(current)
        raise


def _raise_if_symlink(dir_fd: int, name: str) -> None:
    """O_DIRECTORY | O_NOFOLLOW says ENOTDIR for a symlink; say ELOOP, like openat2.

    What stands at `name` now may already differ from what the open met: a directory
    there now means it was swapped (a symlink met, then swapped back), so ELOOP too.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
