"""Built-in file tools: read_file, write_file, edit_file, list_dir."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Evidence, Mark, Phase, StopMode, mark
from execgate.executor.locks import Mode

from . import fileio
from .base import ResourceKind, ResourceTemplate, ToolContext, ToolOutput, ToolSpec, schema

_PATH = {"type": "string", "minLength": 1, "description": "Path inside the workspace."}


class ReadFile:
    spec = ToolSpec(
        name="read_file",
        description=(
            "Read a text file. `offset` is the first line (1-based), `limit` the number of "
            "lines. Output past the daemon's cap is cut: the result is PARTIAL and says "
            "which line to continue from."
        ),
        input_schema=schema(
            {
                "path": _PATH,
                "offset": {"type": "integer", "minimum": 1, "default": 1},
                "limit": {"type": "integer", "minimum": 1},
            },
            ["path"],
        ),
        read_only=True,
        idempotent=True,
        resources=(ResourceTemplate(ResourceKind.FILE, "path", Mode.READ),),
    )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        path = ctx.workspace.resolve(args["path"], "arguments.path")
        return await asyncio.to_thread(self._read, path, args, ctx)

    def _read(self, path: Path, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        fd = ctx.workspace.open_file(path, "arguments.path", hard_links_ok=ctx.hard_links(path))
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            first = args.get("offset", 1)
            limit = args.get("limit")
            cap = ctx.limits.output_cap_bytes
            chunks: list[bytes] = []
            used = 0
            line_no = 0
            next_offset = None
            for line_no, line in enumerate(_lines(fh, cap + 1), start=1):
                if line_no < first:
                    continue
                if limit is not None and line_no >= first + limit:
                    line_no -= 1
                    break
                if used + len(line) > cap:
                    chunks.append(line[: cap - used])
                    used = cap
                    next_offset = line_no
                    break
                chunks.append(line)
                used += len(line)
        data = b"".join(chunks)
        structured: dict[str, Any] = {
            "path": ctx.workspace.relative(path),
            "start_line": first,
            "end_line": line_no,
            "file_bytes": size,
            "binary": b"\x00" in data[:8192],
        }
        if next_offset is not None:
            structured["next_offset"] = next_offset
        return ToolOutput(
            text=data.decode("utf-8", errors="replace"),
            structured=structured,
            evidence=Evidence(bytes_read=len(data), path=str(path)),
            truncated=next_offset is not None,
            total_bytes=size,
        )


def _lines(fh: Any, longest: int) -> Any:
    """The file's lines, each cut into pieces of at most `longest` bytes: a file with
    no newline must not be read into memory whole to find its first line."""
    while line := fh.readline(longest):
        yield line


class WriteFile:
    spec = ToolSpec(
        name="write_file",
        description="Create or replace a file with `content`, atomically.",
        input_schema=schema(
            {
                "path": _PATH,
                "content": {"type": "string"},
                "create_dirs": {"type": "boolean", "default": True},
            },
            ["path", "content"],
        ),
        read_only=False,
        destructive=True,
        idempotent=True,
        resources=(ResourceTemplate(ResourceKind.FILE, "path", Mode.WRITE),),
        gated=True,  # fileio.atomic_write: nothing visible before ctx.before_effect()
    )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        path = ctx.workspace.resolve(args["path"], "arguments.path")
        data = args["content"].encode("utf-8")
        make_dirs = args.get("create_dirs", True)
        return await fileio.in_writer_thread(_replace, ctx, path, data, make_dirs)


def _replace(ctx: ToolContext, path: Path, data: bytes, make_dirs: bool) -> ToolOutput:
    try:
        replaced = fileio.atomic_write(
            ctx.workspace,
            path,
            data,
            "arguments.path",
            make_dirs=make_dirs,
            hard_links_ok=ctx.hard_links(path),
            stop=ctx.cancel.requested.is_set,
            before_effect=ctx.before_effect,
        )
    except fileio.WriteAbandoned:
        return _abandoned(ctx)
    after = fileio.sha256(data)
    rel = ctx.workspace.relative(path)
    return ToolOutput(
        text=f"wrote {len(data)} bytes to {rel}",
        structured={"path": rel, "bytes_written": len(data), "created": replaced.created},
        evidence=Evidence(
            bytes_written=len(data),
            sha256_before=replaced.sha256_before,
            sha256_after=after,
            path=str(path),
        ),
    )


def _abandoned(ctx: ToolContext) -> ToolOutput:
    """Cancelled before the rename: the file is as it was, so a known FAILURE."""
    scope = ctx.cancel
    return ToolOutput(
        error_class=ErrorClass.TIMEOUT if scope.timed_out else ErrorClass.CANCELLED,
        message=f"stopped before the file was replaced ({scope.reason}); nothing was written",
        stopped_how=StopMode.COOPERATIVE,
        marks=(Mark(Phase.CANCEL_REQUESTED, scope.requested_at, scope.reason), mark(Phase.STOPPED)),
        rolled_back=True,
    )


class EditFile:
    spec = ToolSpec(
        name="edit_file",
        description=(
            "Replace `old_string` with `new_string` in a file. `old_string` must occur "
            "exactly once unless `replace_all` is true; zero or several matches change nothing."
        ),
        input_schema=schema(
            {
                "path": _PATH,
                "old_string": {"type": "string", "minLength": 1},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean", "default": False},
            },
            ["path", "old_string", "new_string"],
        ),
        read_only=False,
        destructive=True,
        resources=(ResourceTemplate(ResourceKind.FILE, "path", Mode.WRITE),),
        gated=True,  # fileio.atomic_write: nothing visible before ctx.before_effect()
    )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        path = ctx.workspace.resolve(args["path"], "arguments.path")
        return await fileio.in_writer_thread(self._edit, path, args, ctx)

    def _edit(self, path: Path, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        cap = ctx.limits.file_cap_bytes
        old = fileio.read_all(
            ctx.workspace, path, "arguments.path", cap=cap, hard_links_ok=ctx.hard_links(path)
        )
        text = old.decode("utf-8", errors="surrogateescape")
        count = text.count(args["old_string"])
        if count == 0:
            raise ToolError(
                ErrorClass.NO_MATCH,
                "old_string does not occur in the file",
                field="arguments.old_string",
            )
        if count > 1 and not args.get("replace_all", False):
            raise ToolError(
                ErrorClass.AMBIGUOUS_MATCH,
                f"old_string occurs {count} times; add context to make it unique "
                "or set replace_all",
                field="arguments.old_string",
            )
        # Known before anything is built: refuse a result over the cap up front.
        grows = len(_utf8(args["new_string"])) - len(_utf8(args["old_string"]))
        size = len(old) + count * grows
        if size > cap:
            rel = ctx.workspace.relative(path)
            raise fileio.too_large(rel, size, cap, "arguments.new_string")
        new_text = text.replace(args["old_string"], args["new_string"])
        out = _replace(ctx, path, _utf8(new_text), False)
        if out.stopped_how is not StopMode.COMPLETED:
            return out
        structured = {**out.structured, "replacements": count}
        return ToolOutput(
            text=f"replaced {count} occurrence(s) in {structured['path']}",
            structured=structured,
            evidence=out.evidence,
        )


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


class ListDir:
    spec = ToolSpec(
        name="list_dir",
        description="List a directory: one entry per line, directories end with '/'.",
        input_schema=schema(
            {
                "path": {**_PATH, "default": "."},
                "max_entries": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
            },
            [],
        ),
        read_only=True,
        idempotent=True,
        resources=(ResourceTemplate(ResourceKind.TREE, "path", Mode.READ),),
    )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        path = ctx.workspace.resolve(args.get("path", "."), "arguments.path")
        return await asyncio.to_thread(self._list, path, args.get("max_entries", 1000), ctx)

    def _list(self, path: Path, max_entries: int, ctx: ToolContext) -> ToolOutput:
        fd = ctx.workspace.open_dir(path, "arguments.path")
        try:
            listed = sorted(os.listdir(fd))
            # Entries the policy denies to this call are not shown (counted only). A
            # symlink is judged by its target; one leading outside is listed (a name,
            # never followed: reading it is refused by the workspace confinement).
            names = [n for n in listed if _shown(path / n, ctx)]
            entries = [_entry(fd, name) for name in names[:max_entries]]
        finally:
            os.close(fd)
        lines = [e["name"] + ("/" if e["type"] == "dir" else "") for e in entries]
        return ToolOutput(
            text="\n".join(lines),
            structured={
                "path": ctx.workspace.relative(path),
                "entries": entries,
                "total_entries": len(names),
                "hidden_by_policy": len(listed) - len(names),
            },
            truncated=len(names) > max_entries,
        )


def _shown(entry: Path, ctx: ToolContext) -> bool:
    real = ctx.workspace.canonical(entry)
    if real is None:  # changed while it was listed: shown as a name, never followed
        return True
    return not ctx.workspace.contains(str(real)) or ctx.readable(real)


def _entry(dir_fd: int, name: str) -> dict[str, Any]:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    kind = (
        "dir"
        if stat.S_ISDIR(st.st_mode)
        else "symlink"
        if stat.S_ISLNK(st.st_mode)
        else "file"
        if stat.S_ISREG(st.st_mode)
        else "other"
    )
    return {"name": name, "type": kind, "size": st.st_size}
