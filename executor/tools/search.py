"""Built-in `search`: a regular expression over the files under a path.

Uses the `regex` module rather than `re` because it takes a timeout: a
catastrophically backtracking pattern from a model must not pin a daemon thread.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import regex

from execgate.executor.core.errors import ExecgateError, ToolError, invalid
from execgate.executor.core.outcomes import ErrorClass, Evidence, Phase, StopMode, mark
from execgate.executor.core.regexbound import check_pattern
from execgate.executor.locks import Mode

from .base import ResourceKind, ResourceTemplate, ToolContext, ToolOutput, ToolSpec, schema

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_PATTERN_CHARS = 4096
MAX_LINE_CHARS = 500
LINE_SECONDS = 1.0
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules"})


class Search:
    spec = ToolSpec(
        name="search",
        description=(
            "Search files under `path` for a regular expression; one 'file:line: text' "
            "row per matching line. Skips binary files, files over 8 MiB and VCS folders."
        ),
        input_schema=schema(
            {
                "pattern": {"type": "string", "minLength": 1, "maxLength": MAX_PATTERN_CHARS},
                "path": {"type": "string", "minLength": 1, "default": "."},
                "glob": {
                    "type": "string",
                    "description": "Only files whose relative path matches this glob, e.g. '*.py'.",
                },
                "case_insensitive": {"type": "boolean", "default": False},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 200},
            },
            ["pattern"],
        ),
        read_only=True,
        idempotent=True,
        resources=(ResourceTemplate(ResourceKind.TREE, "path", Mode.READ),),
    )

    def check(self, args: dict[str, Any]) -> None:
        """The pattern's cost is bounded before it is compiled (regexbound), and it
        must compile: both REJECTED at validation, naming `arguments.pattern`."""
        why = check_pattern(args["pattern"], MAX_PATTERN_CHARS)
        if why is not None:
            raise invalid(f"arguments.pattern: {why}", "arguments.pattern")
        _compile(args)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        compiled = _compile(args)  # checked at validation; the module caches it
        root = ctx.workspace.resolve(args.get("path", "."), "arguments.path")
        deadline = time.monotonic() + ctx.timeout
        try:
            return await asyncio.to_thread(self._search, compiled, root, args, ctx, deadline)
        except _Cancelled:
            return ToolOutput(
                error_class=ErrorClass.CANCELLED,
                message=f"cancelled: {ctx.cancel.reason}",
                stopped_how=StopMode.COOPERATIVE,
                marks=(mark(Phase.CANCEL_REQUESTED, ctx.cancel.reason), mark(Phase.STOPPED)),
            )

    def _search(
        self,
        pattern: regex.Pattern[str],
        root: Path,
        args: dict[str, Any],
        ctx: ToolContext,
        deadline: float,
    ) -> ToolOutput:
        limit = args.get("max_results", 200)
        glob = args.get("glob")
        rows: list[str] = []
        scanned = 0
        walk = _Walk(ctx)
        for path, fd in walk.files(root):
            with os.fdopen(fd, "rb") as fh:
                rel = ctx.workspace.relative(path)
                if glob and not (fnmatch.fnmatch(rel, glob) or fnmatch.fnmatch(path.name, glob)):
                    continue
                if time.monotonic() > deadline:
                    raise ToolError(ErrorClass.TIMEOUT, f"search stopped after {scanned} files")
                scanned += 1
                rows.extend(_matches(pattern, fh, rel, deadline, ctx))
            if len(rows) > limit:
                break
        # Only a match beyond the limit proves that something was left out.
        hit_limit = len(rows) > limit
        rows = rows[:limit]
        structured: dict[str, Any] = {
            "matches": len(rows),
            "files_scanned": scanned,
            "limited": hit_limit,
        }
        if walk.hard_linked:
            structured["skipped_hard_links"] = walk.hard_linked
        return ToolOutput(
            text="\n".join(rows),
            structured=structured,
            evidence=Evidence(path=str(root)),
            truncated=hit_limit,
        )


def _compile(args: dict[str, Any]) -> regex.Pattern[str]:
    flags = regex.IGNORECASE if args.get("case_insensitive") else 0
    try:
        return regex.compile(args["pattern"], flags)
    except (regex.error, OverflowError, RecursionError, ValueError) as exc:
        raise invalid(f"pattern is not a valid regex: {exc}", "arguments.pattern") from exc


class _Walk:
    """The files under a root, each opened through the workspace's no-follow walk.

    A directory is listed from its own descriptor and its entries are opened
    relative to it (O_NOFOLLOW), so a component swapped for a symlink while the
    search runs is skipped, never followed. A symlink found in the tree is judged by
    its canonical target: inside the workspace and readable by the policy, that
    target is opened by its canonical path (no symlink allowed on the way);
    directories behind symlinks are not descended (as `os.walk` does not).
    Yields (canonical path, open descriptor of a regular file); the caller closes it.
    """

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx
        self.ws = ctx.workspace
        # Regular files left out because they have more than one hard link.
        self.hard_linked = 0

    def files(self, root: Path) -> Iterator[tuple[Path, int]]:
        fd = self.ws.open(root, os.O_RDONLY | os.O_NONBLOCK, "arguments.path")
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            yield from self._tree(root, fd)
        else:
            yield from self._regular(root, fd)

    def _tree(self, top: Path, dir_fd: int) -> Iterator[tuple[Path, int]]:
        try:
            try:
                with os.scandir(dir_fd) as listing:
                    entries = sorted(listing, key=lambda e: e.name)
            except OSError:
                return
            for entry in entries:
                yield from self._entry(top, dir_fd, entry)
        finally:
            os.close(dir_fd)

    def _entry(self, top: Path, dir_fd: int, entry: os.DirEntry[str]) -> Iterator[tuple[Path, int]]:
        path = top / entry.name
        if entry.is_symlink():
            yield from self._linked(path)
            return
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(entry.name, flags, dir_fd=dir_fd)
        except OSError:
            return  # gone, or swapped for a symlink since it was listed: not followed
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            if entry.name in SKIP_DIRS or not self.ctx.readable(path):
                os.close(fd)
                return
            yield from self._tree(path, fd)
        else:
            yield from self._regular(path, fd)

    def _linked(self, link: Path) -> Iterator[tuple[Path, int]]:
        real = self.ws.canonical(link)
        if real is None or not self.ws.contains(str(real)):
            return
        try:
            fd = self.ws.open(real, os.O_RDONLY | os.O_NONBLOCK, "arguments.path")
        except ToolError:
            return
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            return
        yield from self._regular(real, fd)

    def _regular(self, path: Path, fd: int) -> Iterator[tuple[Path, int]]:
        """`fd` if it is a regular file the search may read; closed otherwise."""
        st = os.fstat(fd)
        # Not a FIFO or device: reading one could block the worker thread forever.
        wanted = stat.S_ISREG(st.st_mode) and st.st_size <= MAX_FILE_BYTES
        if wanted and st.st_nlink > 1 and not self.ctx.hard_links(path):
            self.hard_linked += 1
            wanted = False
        if not wanted or not self.ctx.readable(path):
            os.close(fd)
            return
        yield path, fd


class _Cancelled(ExecgateError):
    """The call's cancel scope fired; raised inside the worker thread."""


def _matches(
    pattern: regex.Pattern[str], fh: BinaryIO, rel: str, deadline: float, ctx: ToolContext
) -> list[str]:
    try:
        data = fh.read(MAX_FILE_BYTES + 1)
    except OSError:
        return []
    if b"\x00" in data[:8192]:
        return []
    text = data.decode("utf-8", errors="replace")
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        # Read from a worker thread: a plain flag read, safe without the loop.
        if ctx.cancel.requested.is_set():
            raise _Cancelled
        # One line may take at most LINE_SECONDS, so a cancel is seen that soon.
        budget = max(min(deadline - time.monotonic(), LINE_SECONDS), 0.001)
        try:
            found = pattern.search(line, timeout=budget)
        except TimeoutError as exc:
            raise ToolError(
                ErrorClass.TIMEOUT,
                f"pattern took more than {budget:.1f}s on {rel}:{number}; simplify it",
                field="arguments.pattern",
            ) from exc
        if found:
            rows.append(f"{rel}:{number}: {line[:MAX_LINE_CHARS]}")
    return rows
