"""Commands that say what they write: the declared write paths, made ready for the
sandbox under the call's locks, and a refused write told apart from other failures.

A command that declares its effects (`run_command` with `reads`/`writes`, a command
tool with `effects:`) runs with the workspace read-only but for its declared write
paths (bwrap binds, docker mounts). Only an existing file or directory can be bound,
so a declared path that does not exist yet is made when the call starts, under its
locks: as a directory when it was declared with a trailing `/`, else as an empty
file. Its directory must exist by then (FAILURE `not_found` otherwise, nothing run;
an earlier call of the batch may make it): only the declared path is made, the one
key the call holds a WRITE lock on, never a parent other calls may be using. What
was made and is still as it was made when the command ends (an empty file nobody
wrote, an empty directory) is removed again: a call leaves behind only what its
command wrote. A file can be written in place but not replaced through a rename (it
is a mount point); to create or replace files, declare their directory.

A write outside the declaration fails in the command with EROFS; the command
decides what it does then. A command that exits non-zero having printed the
system's words for it ("Read-only file system") is reported FAILURE
`permission_denied` naming the declared writes instead of `nonzero_exit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.core.paths import Workspace, hard_link_refused

from .base import Declared, ToolContext, ToolOutput

# What strerror(EROFS) says in the C locale commands run with (command.BASE_ENV).
EROFS_TEXT = os.strerror(errno.EROFS)


def declared_write(workspace: Workspace, text: str, field: str) -> Declared:
    """A write path as a call declares it: resolved inside the workspace (an escape is
    REJECTED naming `field`), and a file or a directory if it exists."""
    path = workspace.resolve(text, field)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None  # made when the call starts, if its directory is there by then
    except OSError as exc:
        raise _refused(ErrorClass.INVALID_ARGUMENT, field, f"{text!r}: {exc.strerror}") from exc
    if st is not None:
        _check_kind(st, text, field)
    return Declared(field, text, path, text.endswith("/"))


def _check_kind(st: os.stat_result, text: str, field: str) -> None:
    """A declared write path must be a regular file or a directory; a symlink there was
    swapped in since the path was resolved (canonical paths hold none). REJECTED: once
    the call has started that reads FAILURE (results.from_error); nothing ran."""
    status = Status.REJECTED
    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISLNK(st.st_mode):
        why = f"{text!r} became a symlink while the call was checked; not followed"
        raise ToolError(ErrorClass.PERMISSION_DENIED, why, field=field, status=status)
    why = f"{text!r} is neither a regular file nor a directory"
    raise ToolError(ErrorClass.INVALID_ARGUMENT, why, field=field, status=status)


def _refused(error_class: ErrorClass, field: str, message: str) -> ToolError:
    return ToolError(error_class, message, field=field, status=Status.REJECTED)


@dataclass(frozen=True, slots=True)
class _Made:
    """What `_ready` made (None: nothing, it was there) and its (inode, mtime in ns)."""

    path: Path | None = None
    directory: bool = False
    stamp: tuple[int, int] = (0, 0)


@contextlib.asynccontextmanager
async def writable(ctx: ToolContext) -> AsyncIterator[tuple[Path, ...] | None]:
    """The paths the sandbox must bind writable (None: the call declared nothing, so
    the workspace is bound as `ctx.may_write` says), made ready under the call's
    locks; what was made and left untouched is removed afterwards."""
    declared = ctx.confined
    if declared is None:
        yield None
        return
    if not getattr(ctx.sandbox, "confines_writes", False):
        name = getattr(ctx.sandbox, "name", "none")
        raise ToolError(
            ErrorClass.SANDBOX_ERROR,
            f"the {name} sandbox cannot keep the workspace read-only outside the declared "
            "writes; the call was scheduled as if it could",
        )
    made = await asyncio.to_thread(_ready_all, ctx.workspace, declared, ctx.hard_links)
    try:
        yield tuple(d.path for d in declared)
    finally:
        await asyncio.to_thread(_tidy, ctx.workspace, made)


def _ready_all(
    ws: Workspace, declared: tuple[Declared, ...], hard_links: Callable[[Path], bool]
) -> list[_Made]:
    made: list[_Made] = []
    try:
        for one in declared:
            made.append(_ready(ws, one, hard_links))
    except BaseException:
        _tidy(ws, made)
        raise
    return made


def _ready(ws: Workspace, one: Declared, hard_links: Callable[[Path], bool]) -> _Made:
    """Check one declared path again (now, under the locks) and make it if it is missing."""
    if ws.resolve(one.text, one.field) != one.path:
        raise ToolError(
            ErrorClass.PERMISSION_DENIED,
            f"{one.text!r} changed since the call was checked (a symlink?)",
            field=one.field,
        )
    st = ws.lstat(one.path, one.field)
    if st is not None:
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and not hard_links(one.path):
            raise hard_link_refused(ws.relative(one.path), st.st_nlink, one.field)
        _check_kind(st, one.text, one.field)
        return _Made()
    return _make(ws, one)


def _make(ws: Workspace, one: Declared) -> _Made:
    """Make the missing path (an empty file, or a directory) in its existing directory,
    owned and writable like that directory: whoever could have made it there can write
    it, and nobody else (commands run as different users per backend)."""
    try:
        parent, name = ws.open_parent(one.path, one.field, create=False)
    except ToolError as err:
        if err.error_class is not ErrorClass.NOT_FOUND:
            raise
        raise ToolError(
            ErrorClass.NOT_FOUND,
            f"{one.text!r}: its directory does not exist (a missing write path is made, "
            "not its parents: declare an existing directory, or a path in one)",
            field=one.field,
        ) from err
    try:
        around = os.fstat(parent)
        if one.directory:
            os.mkdir(name, 0o700, dir_fd=parent)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(name, flags, 0o600, dir_fd=parent)
    except OSError as exc:
        raise ToolError(
            ErrorClass.IO_ERROR, f"could not make {one.text!r}: {exc.strerror}", field=one.field
        ) from exc
    finally:
        os.close(parent)
    try:
        if os.geteuid() == 0:
            os.fchown(fd, around.st_uid, around.st_gid)
        base = 0o555 if one.directory else 0o444
        os.fchmod(fd, base | (around.st_mode & 0o222))
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return _Made(one.path, one.directory, (st.st_ino, st.st_mtime_ns))


def _tidy(ws: Workspace, made: list[_Made]) -> None:
    """Remove what was made for the call and is still as it was made; never raises."""
    for m in reversed(made):
        if m.path is not None:
            with contextlib.suppress(OSError, ToolError):
                _remove_untouched(ws, m)


def _remove_untouched(ws: Workspace, made: _Made) -> None:
    assert made.path is not None
    parent, name = ws.open_parent(made.path, "", create=False)
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if (st.st_ino, st.st_mtime_ns) != made.stamp:
            return  # written (or replaced): the command's
        if made.directory:
            os.rmdir(name, dir_fd=parent)  # only if still empty
        elif stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(name, dir_fd=parent)
    finally:
        os.close(parent)


def judged(out: ToolOutput, declared: tuple[Declared, ...] | None) -> ToolOutput:
    """A confined command that failed after a write was refused: `permission_denied`
    naming what it may write, instead of a bare non-zero exit."""
    if declared is None or out.error_class is not ErrorClass.NONZERO_EXIT:
        return out
    if EROFS_TEXT not in out.text:
        return out
    allowed = ", ".join(d.text for d in declared) or "nothing (it declared no writes)"
    message = (
        f"{out.message}: a write outside the declared paths was refused ({EROFS_TEXT}); "
        f"this call may write only {allowed}"
    )
    return replace(out, error_class=ErrorClass.PERMISSION_DENIED, message=message)
