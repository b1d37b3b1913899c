"""The system calls a warm sandbox's supervisor builds each call's view with (stdlib only).

This module runs in two places: in the daemon (tests, the probe) and inside the
warm sandbox, where the supervisor imports it by file name beside itself -- so it
imports nothing of execgate. Every call raises OSError with the kernel's errno.

The mount calls are the new mount API (Linux 5.12 for `mount_setattr`): a
call's workspace is a detached copy of the sandbox's workspace mount
(`open_tree`), made read-only or not (`mount_setattr`) and attached in the
call's own mount namespace (`move_mount`). A classic bind from a descriptor
cannot do this: the kernel refuses a bind whose source lies in another mount
namespace. Their numbers are the same on every architecture (the unified table).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 1 << 18

AT_FDCWD = -100
MNT_DETACH = 0x2
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4

# linux/openat2.h: the walk refuses every symlink and every step out of the root.
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x02, 0x04, 0x08

SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_OPENAT2, SYS_MOUNT_SETATTR = 428, 429, 437, 442

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _checked(ret: int, what: str, path: str | None = None) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", path)
    return ret


def _b(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def unshare(flags: int) -> None:
    _checked(_libc.unshare(flags), "unshare")


def setns(fd: int, flags: int) -> None:
    _checked(_libc.setns(fd, flags), "setns")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    ret = _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data or None))
    _checked(ret, f"mount {fstype or source or ''} on {target}", target)


def open_tree(dirfd: int, path: str, flags: int) -> int:
    """A descriptor of the mount at `path`; with OPEN_TREE_CLONE a detached copy of it."""
    ret = _libc.syscall(ctypes.c_long(SYS_OPEN_TREE), dirfd, _b(path), flags)
    return _checked(ret, "open_tree", path)


def clone_tree(fd: int) -> int:
    """A detached, recursive copy of the mount tree at descriptor `fd`."""
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH
    return open_tree(fd, "", flags)


def move_mount(fd: int, target: str) -> None:
    """Attach the (detached) tree `fd` at `target`."""
    args = (ctypes.c_long(SYS_MOVE_MOUNT), fd, b"", AT_FDCWD, _b(target), MOVE_MOUNT_F_EMPTY_PATH)
    _checked(_libc.syscall(*args), "move_mount", target)


def mount_setattr(fd: int, attr_set: int, attr_clr: int = 0) -> None:
    """Set (and clear) mount attributes on the tree at `fd`, recursively."""
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    flags = AT_EMPTY_PATH | AT_RECURSIVE
    args = (ctypes.c_long(SYS_MOUNT_SETATTR), fd, b"", flags, ctypes.byref(attr))
    _checked(_libc.syscall(*args, ctypes.sizeof(attr)), "mount_setattr")


def open_beneath(root: int, rel: str, flags: int) -> int:
    """openat2 beneath `root`, no symlink anywhere (a path swapped for one: ELOOP)."""
    resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    args = (ctypes.c_long(SYS_OPENAT2), root, _b(rel or "."), ctypes.byref(how))
    return _checked(_libc.syscall(*args, ctypes.sizeof(how)), "openat2", rel)


def set_dumpable(on: bool) -> None:
    """Non-dumpable: no process without CAP_SYS_PTRACE may ptrace us or read our /proc
    files (fd, mem, environ), whatever its uid."""
    _checked(_libc.prctl(PR_SET_DUMPABLE, int(on), 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def confine_self(last_cap: int) -> None:
    """Keep our effective and permitted capabilities, but let nothing we exec have any:
    the bounding, inheritable and ambient sets emptied, no-new-privileges set.

    A program exec'd by uid 0 gets (inheritable & file's) | (file's & bounding) as its
    permitted set, the file's being all of them for uid 0: with both our sets empty,
    that is nothing -- the command starts with no capability, as a cold sandbox's."""
    _checked(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient")
    for cap in range(last_cap + 1):
        _checked(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop bounding capability")
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _checked(_libc.capget(ctypes.byref(header), data), "capget")
    for half in data:
        half.inheritable = 0
    _checked(_libc.capset(ctypes.byref(header), data), "capset")
    _checked(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def loopback_up() -> None:
    """Bring `lo` up in our network namespace (a new one has it down), as bwrap does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


def umount(target: str) -> None:
    """Detach the mount at `target` (lazily: freed once nothing holds it)."""
    _checked(_libc.umount2(_b(target), MNT_DETACH), f"umount {target}", target)


def last_capability() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        return int(f.read())
