"""Built-in `run_command`: an argv in its own session and process group.

No shell is involved: `argv` is executed as given, so `;`, `&&` and `$(...)` are
plain arguments. The environment is scrubbed to a small fixed set. When the call
ends -- normally, on timeout or on cancel -- nothing it started is left running
(executor.cancel: the ladder; executor.sandbox: where it runs and how it is
contained).

A call may declare the paths it reads and writes (`reads`, `writes`): it then
locks only those (READ, WRITE) instead of the whole workspace, and runs with the
workspace read-only but for its write paths (confine.py). Where the sandbox cannot
enforce that (`process`), the pipeline gives it the whole workspace again.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Evidence, StopMode
from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Claim, Mode, workspace_key
from execgate.executor.sandbox import (
    Captured,
    Launch,
    ProgramNotExecutable,
    ProgramNotFound,
    SandboxError,
)
from execgate.executor.sandbox.ladder import Stopped, supervise

from . import confine
from .base import ResourceKind, ResourceTemplate, ToolContext, ToolOutput, ToolSpec, schema
from .effects import CallEffects, file_key

BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
_ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"
# The most paths one call may declare in `reads` and in `writes` (each is a lock key,
# and each write a mount).
MAX_DECLARED = 64
_PATHS = {
    "type": "array",
    "items": {"type": "string", "minLength": 1},
    "maxItems": MAX_DECLARED,
}


class RunCommand:
    spec = ToolSpec(
        name="run_command",
        description=(
            "Run a program: `argv` is executed directly, without a shell. Runs in `cwd` "
            "inside the workspace with a scrubbed environment; stdout and stderr are "
            "captured. A non-zero exit is FAILURE/nonzero_exit with the output attached. "
            "Runs in the sandbox policy chooses for it (bwrap by default: no network, "
            "only the workspace and system directories visible). Without `reads`/`writes` "
            "the command may change anything in the workspace, so it runs alone. With them "
            "it locks only those paths (others' calls on other paths run at the same time) "
            "and the workspace is read-only to it except `writes`: a write elsewhere fails "
            "(FAILURE permission_denied). A `writes` path that does not exist is made first "
            "(a directory if it ends with '/', else an empty file); to create or replace "
            "files, declare their directory."
        ),
        input_schema=schema(
            {
                "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "cwd": {"type": "string", "minLength": 1, "default": "."},
                "stdin": {"type": "string"},
                "env": {
                    "type": "object",
                    "propertyNames": {"pattern": _ENV_NAME},
                    "additionalProperties": {"type": "string"},
                },
                "reads": _PATHS,
                "writes": _PATHS,
            },
            ["argv"],
        ),
        read_only=False,
        destructive=True,
        # `cwd` is listed so that validation resolves it: a cwd outside the workspace
        # is REJECTED before the call starts, like every other path argument.
        resources=(
            ResourceTemplate(ResourceKind.WORKSPACE, "", Mode.WRITE),
            ResourceTemplate(ResourceKind.TREE, "cwd", Mode.WRITE),
        ),
    )

    # Its analysis only resolves paths: validation runs it on the event loop.
    quick_analysis = True

    def call_effects(
        self, args: dict[str, Any], paths: Mapping[str, Path], workspace: Workspace
    ) -> CallEffects:
        """The whole workspace written, unless the call declares what it reads and writes."""
        del paths  # cwd is resolved by validation (the TREE template): checked, not locked
        if "reads" not in args and "writes" not in args:
            return CallEffects((Claim(workspace_key(workspace.lock_root), Mode.WRITE),), True)
        found: dict[str, Path] = {}
        claims = []
        for i, text in enumerate(args.get("reads", ())):
            field = f"arguments.reads[{i}]"
            found[field] = path = workspace.resolve(text, field)
            claims.append(Claim(file_key(workspace, path), Mode.READ))
        writes = []
        for i, text in enumerate(args.get("writes", ())):
            declared = confine.declared_write(workspace, text, f"arguments.writes[{i}]")
            found[declared.field] = declared.path
            claims.append(Claim(file_key(workspace, declared.path), Mode.WRITE))
            writes.append(declared)
        return CallEffects(tuple(claims), bool(writes), paths=found, confined=tuple(writes))

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        argv = args["argv"]
        for i, item in enumerate(argv):
            if "\x00" in item:
                raise ToolError(
                    ErrorClass.INVALID_ARGUMENT,
                    "argv item contains a NUL byte",
                    field=f"arguments.argv[{i}]",
                )
        for name, value in args.get("env", {}).items():
            if "\x00" in value:
                raise ToolError(
                    ErrorClass.INVALID_ARGUMENT,
                    "env value contains a NUL byte",
                    field=f"arguments.env.{name}",
                )
        cwd = ctx.workspace.resolve(args.get("cwd", "."), "arguments.cwd")
        if not cwd.is_dir():
            raise ToolError(
                ErrorClass.NOT_FOUND, f"{cwd} is not a directory", field="arguments.cwd"
            )
        env = {**BASE_ENV, "HOME": str(ctx.workspace.root), **args.get("env", {})}
        stdin = args.get("stdin")
        async with confine.writable(ctx) as writes:
            launch = Launch(
                argv=tuple(argv),
                cwd=cwd,
                env=env,
                stdin=stdin.encode() if stdin is not None else None,
                workspace=ctx.workspace.root,
                writable=ctx.may_write and writes is None,
                write_paths=writes or (),
                marker=ctx.marker or secrets.token_hex(8),
                confinement=ctx.confinement,
                output_cap=ctx.limits.raw_cap_bytes,
                run_id=ctx.run_id,
            )
            out = await run_sandboxed(launch, ctx)
        return confine.judged(out, ctx.confined)


async def run_sandboxed(launch: Launch, ctx: ToolContext) -> ToolOutput:
    """Start `launch` in the call's sandbox and supervise it to its end (or its stop)."""
    if ctx.sandbox is None:
        raise ToolError(ErrorClass.SANDBOX_ERROR, "no sandbox is configured for this call")
    try:
        running = await ctx.sandbox.start(launch)
    except ProgramNotFound as exc:
        raise ToolError(ErrorClass.NOT_FOUND, str(exc), field="arguments.argv[0]") from exc
    except ProgramNotExecutable as exc:
        raise ToolError(ErrorClass.PERMISSION_DENIED, str(exc), field="arguments.argv[0]") from exc
    except SandboxError as exc:
        raise ToolError(ErrorClass.SANDBOX_ERROR, f"{ctx.sandbox.name}: {exc}") from exc
    try:
        stopped = await supervise(
            running,
            ctx.cancel,
            time_limit=ctx.remaining(),
            nominal=ctx.timeout,
            grace=ctx.limits.grace,
            max_grace=ctx.limits.max_grace,
        )
        out, err = await running.output()
    finally:
        await running.release()
    return _output(stopped, out, err, ctx.sandbox.name)


def _output(stopped: Stopped, out: Captured, err: Captured, where: str) -> ToolOutput:
    stdout = out.data.decode("utf-8", errors="replace")
    stderr = err.data.decode("utf-8", errors="replace")
    text = stdout if not stderr else f"{stdout}\n[stderr]\n{stderr}" if stdout else stderr
    ended = stopped.exit
    error, message = stopped.reason, ""
    if stopped.how is StopMode.COMPLETED and ended.oom_killed:
        error, message = ErrorClass.RESOURCE_EXHAUSTED, "killed: out of memory (sandbox limit)"
    elif stopped.how is StopMode.COMPLETED and ended.code != 0:
        error = ErrorClass.NONZERO_EXIT
        message = (
            f"exited with status {ended.code}"
            if ended.signal is None
            else f"killed by signal {ended.signal}"
        )
    elif stopped.how is not StopMode.COMPLETED:
        message = f"{stopped.reason.value}: stopped {stopped.how.value}"
        if stopped.survivors:
            message += f"; {stopped.survivors} process(es) could not be killed"
    survivors = stopped.survivors
    if out.held_open or err.held_open:
        # Someone still writes to our pipes: a process of the call that left every
        # place the sandbox looks (its cgroup, its marker). Nothing is verified.
        survivors = None
        escaped = "a process the sandbox could not find still held the output open"
        message = f"{message}; {escaped}" if message else escaped
    return ToolOutput(
        text=text,
        structured={
            "exit_code": ended.code,
            "signal": ended.signal,
            "stdout_bytes": out.total,
            "stderr_bytes": err.total,
        },
        evidence=Evidence(
            exit_code=ended.code,
            signal=ended.signal,
            sandbox=where,
            oom_killed=ended.oom_killed or None,
            survivors=survivors,
        ),
        truncated=out.truncated or err.truncated,
        total_bytes=out.total + err.total,
        error_class=error,
        message=message,
        stopped_how=stopped.how,
        marks=stopped.marks,
    )
