"""SQLite's own file opens, held to the workspace like every other tool's.

The `sql` tool gives SQLite a path, and SQLite opens by name: the database when
connecting, then its journal, WAL and shared-memory files beside it, the
directory for fsync, again at every write transaction in rollback mode. A check
of the path before connecting (or of `PRAGMA database_list` after) is a
check-then-use race: a directory swapped for a symlink in between sends those
opens, and file creations, outside the workspace.

So SQLite's file opens go through the same no-follow walk as the other tools'.
SQLite's unix VFS makes its system calls through a table that can be rewired
(`sqlite3_vfs.xSetSystemCall`); the entries that take a path -- open, unlink,
access, stat, lstat, readlink, mkdir, rmdir -- are replaced once by functions
that, on a thread inside `confined(...)`, resolve the path beneath the
workspace's descriptor (`beneath.open_beneath`: no symlink, no step out) and
refuse anything else, and on every other thread (the journal's) call SQLite's own.

Inside a confined thread:

- a path inside the root is opened beneath the root's descriptor, never following
  a symlink; a regular file with more than one hard link is refused unless the
  policy allows hard links there (its other name may be outside);
- the root's own ancestors may be lstat'ed (SQLite canonicalises the name it is
  given component by component); nothing else outside the root is reachable,
  except reading /dev/urandom;
- readlink always fails: SQLite follows no symlink it finds;
- temporary files are kept in memory (`PRAGMA temp_store = MEMORY`, set by the
  callers), since they would be made outside the workspace.

What was refused is noted on the scope, so the call's error can say why SQLite
could not open a file.
"""

from __future__ import annotations

import _sqlite3  # the extension module: its handle reaches the SQLite it links
import contextlib
import ctypes
import errno
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from execgate.executor.core import beneath

_RANDOM = b"/dev/urandom"
# Errors that mean the walk refused a path (a symlink, an escape, a component that is
# no longer a directory: the tree changed under the walk), not that it failed.
_REFUSALS = frozenset({errno.ELOOP, errno.EXDEV, errno.EACCES, errno.ENOTDIR})


@dataclass(slots=True)
class Scope:
    """One confined thread's workspace: its root, descriptor and hard-link answer."""

    root: bytes
    fd: int
    hard_links_ok: Callable[[str], bool]
    ancestors: frozenset[bytes] = frozenset()
    # What SQLite was refused, newest last (for the call's error message).
    refused: list[str] = field(default_factory=list)

    def relative(self, path: bytes) -> str | None:
        """`path` relative to the root ("" for the root itself); None when outside."""
        if path == self.root:
            return ""
        if path.startswith(self.root + b"/"):
            return os.fsdecode(path[len(self.root) + 1 :])
        return None

    def refuse(self, what: str, err: int) -> int:
        self.refused.append(what)
        ctypes.set_errno(err)
        return -1


_local = threading.local()


def _scope() -> Scope | None:
    return getattr(_local, "scope", None)


@contextlib.contextmanager
def confined(root: Path, root_fd: int, hard_links_ok: Callable[[str], bool]) -> Iterator[Scope]:
    """Every SQLite file access this thread makes inside the block stays beneath `root`."""
    if not INSTALLED:
        raise RuntimeError("SQLite's file opens cannot be confined with this SQLite build")
    raw = os.fsencode(root)
    parents = {raw, *(os.fsencode(p) for p in root.parents)}
    scope = Scope(raw, root_fd, hard_links_ok, frozenset(parents))
    previous = _scope()
    _local.scope = scope
    try:
        yield scope
    finally:
        _local.scope = previous


# -- the replacement system calls ---------------------------------------------------

_OPEN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, use_errno=True)
_PATH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, use_errno=True)
_ACCESS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int, use_errno=True)
_STAT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, use_errno=True)
_FSTAT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, use_errno=True)
_MKDIR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_uint, use_errno=True)
_READLINK = ctypes.CFUNCTYPE(
    ctypes.c_ssize_t, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, use_errno=True
)
# SQLite's own entries, called for threads that are not confined.
_original: dict[str, Any] = {}


def _guarded(default_errno: int = errno.EIO) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """A ctypes callback must never raise: an exception would return 0 (a valid fd)."""

    def wrap(fn: Callable[..., int]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            try:
                return fn(*args)
            except OSError as exc:
                scope = _scope()
                if scope is not None and exc.errno in _REFUSALS:
                    scope.refused.append(f"{exc.filename}: {exc.strerror}")
                ctypes.set_errno(exc.errno or default_errno)
                return -1
            except BaseException:
                ctypes.set_errno(default_errno)
                return -1

        return call

    return wrap


@_guarded()
def _open(path: bytes, flags: int, mode: int) -> int:
    scope = _scope()
    if scope is None:
        return int(_original["open"](path, flags, mode))
    rel = scope.relative(path)
    if rel is None:
        if path == _RANDOM and flags & os.O_ACCMODE == os.O_RDONLY:
            return int(_original["open"](path, flags, mode))
        return scope.refuse(f"{os.fsdecode(path)} is outside the workspace", errno.EACCES)
    try:
        fd = beneath.open_beneath(scope.fd, rel, flags, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV):
            return scope.refuse(f"{rel} is or became a symlink; not followed", exc.errno)
        raise
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and not scope.hard_links_ok(rel):
        os.close(fd)
        return scope.refuse(f"{rel} has {st.st_nlink} hard links", errno.EACCES)
    return fd


@_guarded()
def _unlink(path: bytes) -> int:
    scope = _scope()
    if scope is None:
        return int(_original["unlink"](path))
    rel = scope.relative(path)
    if not rel:
        return scope.refuse(f"unlink of {os.fsdecode(path)}", errno.EACCES)
    parent, name = beneath.open_parent(scope.fd, rel)
    try:
        os.unlink(name, dir_fd=parent)
    finally:
        os.close(parent)
    return 0


@_guarded()
def _access(path: bytes, mode: int) -> int:
    scope = _scope()
    if scope is None:
        return int(_original["access"](path, mode))
    rel = scope.relative(path)
    if not rel:
        return scope.refuse(f"access to {os.fsdecode(path)}", errno.EACCES)
    parent, name = beneath.open_parent(scope.fd, rel)
    try:
        ok = os.access(name, mode, dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(parent)
    if ok:
        return 0
    ctypes.set_errno(errno.ENOENT if mode == os.F_OK else errno.EACCES)
    return -1


def _stat_beneath(scope: Scope, rel: str, buf: int) -> int:
    """stat of `rel` (a trailing symlink is reported as itself, never followed)."""
    fd = beneath.open_beneath(scope.fd, rel, os.O_PATH)
    try:
        return int(_original["fstat"](fd, buf))
    finally:
        os.close(fd)


@_guarded()
def _stat(path: bytes, buf: int) -> int:
    scope = _scope()
    if scope is None:
        return int(_original["stat"](path, buf))
    rel = scope.relative(path)
    if rel is None:
        return scope.refuse(f"stat of {os.fsdecode(path)}", errno.EACCES)
    return _stat_beneath(scope, rel, buf)


@_guarded()
def _lstat(path: bytes, buf: int) -> int:
    scope = _scope()
    if scope is None or path in scope.ancestors:
        return int(_original["lstat"](path, buf))
    rel = scope.relative(path)
    if rel is None:
        return scope.refuse(f"lstat of {os.fsdecode(path)}", errno.EACCES)
    return _stat_beneath(scope, rel, buf)


@_guarded()
def _readlink(path: bytes, buf: bytes, size: int) -> int:
    scope = _scope()
    if scope is None:
        return int(_original["readlink"](path, buf, size))
    return scope.refuse(f"{os.fsdecode(path)} is a symlink; not followed", errno.ELOOP)


@_guarded()
def _mkdir(path: bytes, mode: int) -> int:
    scope = _scope()
    if scope is None:
        return int(_original["mkdir"](path, mode))
    return scope.refuse(f"mkdir {os.fsdecode(path)}", errno.EACCES)


@_guarded()
def _rmdir(path: bytes) -> int:
    scope = _scope()
    if scope is None:
        return int(_original["rmdir"](path))
    return scope.refuse(f"rmdir {os.fsdecode(path)}", errno.EACCES)


# name -> (prototype, replacement); `fstat` is only read, to fill stat buffers.
_REPLACED: dict[str, tuple[Any, Callable[..., int]]] = {
    "open": (_OPEN, _open),
    "unlink": (_PATH, _unlink),
    "access": (_ACCESS, _access),
    "stat": (_STAT, _stat),
    "lstat": (_STAT, _lstat),
    "readlink": (_READLINK, _readlink),
    "mkdir": (_MKDIR, _mkdir),
    "rmdir": (_PATH, _rmdir),
}
# The ctypes callbacks must live as long as SQLite may call them: for good. A list
# alone is not enough: at exit the interpreter clears this module before its final
# collection, which may close a journal connection still open -- and SQLite's close
# calls these (a freed callback there was a segfault). `_immortal` keeps them.
_KEEP: list[Any] = []


def _immortal(obj: Any) -> None:
    """One reference that is never given back: `obj` outlives the interpreter."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


class _VfsV3(ctypes.Structure):
    """`struct sqlite3_vfs` up to version 3 (the system-call methods)."""


_SYSCALL_PTR = ctypes.c_void_p
_VfsV3._fields_ = [
    ("iVersion", ctypes.c_int),
    ("szOsFile", ctypes.c_int),
    ("mxPathname", ctypes.c_int),
    ("pNext", ctypes.c_void_p),
    ("zName", ctypes.c_char_p),
    ("pAppData", ctypes.c_void_p),
    # Version 1 and 2 methods, not called here.
    *(
        (name, ctypes.c_void_p)
        for name in (
            "xOpen",
            "xDelete",
            "xAccess",
            "xFullPathname",
            "xDlOpen",
            "xDlError",
            "xDlSym",
            "xDlClose",
            "xRandomness",
            "xSleep",
            "xCurrentTime",
            "xGetLastError",
            "xCurrentTimeInt64",
        )
    ),
    (
        "xSetSystemCall",
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_VfsV3), ctypes.c_char_p, _SYSCALL_PTR),
    ),
    ("xGetSystemCall", ctypes.CFUNCTYPE(_SYSCALL_PTR, ctypes.POINTER(_VfsV3), ctypes.c_char_p)),
]


def _install() -> bool:
    """Rewire the unix VFS once; False where this SQLite cannot be rewired."""
    try:
        lib = ctypes.CDLL(_sqlite3.__file__)
        find = lib.sqlite3_vfs_find
    except (OSError, AttributeError):
        return False
    find.restype = ctypes.POINTER(_VfsV3)
    find.argtypes = [ctypes.c_char_p]
    vfs = find(b"unix")
    if not vfs or vfs.contents.iVersion < 3:
        return False
    table = vfs.contents
    names = {*_REPLACED, "fstat"}
    for name in names:
        current = table.xGetSystemCall(vfs, name.encode())
        if not current:
            return False
        proto = _REPLACED[name][0] if name in _REPLACED else _FSTAT
        _original[name] = proto(current)
    for name, (proto, fn) in _REPLACED.items():
        callback = proto(fn)
        _KEEP.append(callback)
        _immortal(callback)
        if table.xSetSystemCall(vfs, name.encode(), ctypes.cast(callback, ctypes.c_void_p)) != 0:
            return False
    return True


# Once, before the daemon opens its journal (this module is imported with the tools).
INSTALLED = _install()
