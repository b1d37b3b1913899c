"""Test-only tools, served with `--test-tools`: probes for benchmarks and tests.

`noop` touches nothing. `work` runs a real process that reads a counter file, or
read-modify-writes it, sleeping a known time in between: the shape of a lost
update, with declared effects (READ or WRITE on that one file), so the
scheduler's decisions and their absence can both be measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Claim, Mode

from .base import ResourceKind, ResourceTemplate, ToolContext, ToolOutput, ToolSpec, schema
from .command import RunCommand
from .effects import CallEffects, file_key

# Reads the counter ($1), sleeps $2 seconds, and if $3 is 1 writes counter + 1.
_SCRIPT = (
    'v=$(cat "$1" 2>/dev/null || echo 0); sleep "$2"; '
    '[ "$3" = 1 ] && echo $((v+1)) > "$1"; echo "$v"'
)


class Noop:
    """Does nothing and says so."""

    spec = ToolSpec(
        name="noop",
        description="Return `echo` unchanged; touches nothing.",
        input_schema=schema({"echo": {"type": "string"}}, []),
        read_only=True,
        idempotent=True,
    )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(text=args.get("echo", ""))


class Work:
    """A real process reading (or incrementing) a counter file for `seconds`."""

    spec = ToolSpec(
        name="work",
        description="Read the integer in `path` (or increment it, with write=true), "
        "taking `seconds` in a real process.",
        input_schema=schema(
            {
                "path": {"type": "string", "minLength": 1},
                "write": {"type": "boolean", "default": False},
                "seconds": {"type": "number", "minimum": 0, "maximum": 60, "default": 0},
            },
            ["path"],
        ),
        read_only=False,
        resources=(ResourceTemplate(ResourceKind.FILE, "path", Mode.WRITE),),
    )

    quick_analysis = True  # its claims come from its arguments alone

    def call_effects(
        self, args: dict[str, Any], paths: Mapping[str, Path], workspace: Workspace
    ) -> CallEffects:
        write = bool(args.get("write", False))
        mode = Mode.WRITE if write else Mode.READ
        return CallEffects((Claim(file_key(workspace, paths["path"]), mode),), write)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        path = ctx.workspace.resolve(args["path"], "arguments.path")
        flag = "1" if args.get("write", False) else "0"
        argv = ["sh", "-c", _SCRIPT, "sh", str(path), str(args.get("seconds", 0)), flag]
        return await RunCommand().run({"argv": argv}, ctx)


class Fault:
    """Raises an unexpected exception where `stage` says: a stand-in for a daemon bug.

    The tests check what such a bug turns into: an outcome that can be vouched for
    (REJECTED before the start, FAILURE for a reader, UNKNOWN_OUTCOME for a writer),
    journaled before it is reported.
    """

    spec = ToolSpec(
        name="fault",
        description="Raise RuntimeError during analysis or during the run (test only).",
        input_schema=schema(
            {
                "stage": {"enum": ["analysis", "run"]},
                "write": {"type": "boolean", "default": False},
            },
            ["stage"],
        ),
        read_only=False,
    )

    def call_effects(
        self, args: dict[str, Any], paths: Mapping[str, Path], workspace: Workspace
    ) -> CallEffects:
        if args["stage"] == "analysis":
            raise RuntimeError("fault injected during analysis")
        return CallEffects((), bool(args.get("write", False)))

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raise RuntimeError("fault injected during the run")
