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
from pathlib import Path
from typing import Any

import regex

from ..errors import ToolError
from ..outcomes import ErrorClass, Evidence, Phase, StopMode, mark
from .base import Mode, ResourceKind, ResourceTemplate, ToolContext, ToolOutput, ToolSpec, schema

MAX_FILE_BYTES = 8 * 1024 * 1024
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
                "pattern": {"type": "string", "minLength": 1, "maxLength": 4096},
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

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        flags = regex.IGNORECASE if args.get("case_insensitive") else 0
        try:
            compiled = regex.compile(args["pattern"], flags)
        except regex.error as exc:
            raise ToolError(
                ErrorClass.INVALID_ARGUMENT,
                f"pattern is not a valid regex: {exc}",
                field="arguments.pattern",
            ) from exc
        root = ctx.workspace.resolve(args.get("path", "."), "arguments.path")
        if not root.exists():
            raise ToolError(ErrorClass.NOT_FOUND, f"{root} does not exist", field="arguments.path")
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
        for path in _files(root, ctx):
            rel = ctx.workspace.relative(path)
            if glob and not (fnmatch.fnmatch(rel, glob) or fnmatch.fnmatch(path.name, glob)):
                continue
            if time.monotonic() > deadline:
                raise ToolError(ErrorClass.TIMEOUT, f"search stopped after {scanned} files")
            scanned += 1
            rows.extend(_matches(pattern, path, rel, deadline, ctx))
            if len(rows) > limit:
                break
        # Only a match beyond the limit proves that something was left out.
        hit_limit = len(rows) > limit
        rows = rows[:limit]
        return ToolOutput(
            text="\n".join(rows),
            structured={"matches": len(rows), "files_scanned": scanned, "limited": hit_limit},
            evidence=Evidence(path=str(root)),
            truncated=hit_limit,
        )


def _files(root: Path, ctx: ToolContext) -> Any:
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(
            d for d in dirnames if d not in SKIP_DIRS and ctx.readable(Path(dirpath, d))
        )
        for name in sorted(filenames):
            path = Path(dirpath, name)
            real = os.path.realpath(path)  # a symlink is judged by what it points to
            if not ctx.workspace.contains(real) or not ctx.readable(Path(real)):
                continue
            yield path


class _Cancelled(Exception):
    """The call's cancel scope fired; raised inside the worker thread."""


def _matches(
    pattern: regex.Pattern[str], path: Path, rel: str, deadline: float, ctx: ToolContext
) -> list[str]:
    try:
        st = path.stat()
        # Not a FIFO or device: reading one could block the worker thread forever.
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
            return []
        data = path.read_bytes()
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
