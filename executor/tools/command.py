"""Built-in `run_command`: an argv in its own session and process group.

No shell is involved: `argv` is executed as given, so `;`, `&&` and `$(...)` are
plain arguments. The environment is scrubbed to a small fixed set. When the call
ends -- normally, on timeout or on cancel -- nothing it started is left running:
the whole process group is killed. (Full sandboxing, namespaces and rlimits come
with the sandbox backends.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from ..errors import ToolError
from ..outcomes import ErrorClass, Evidence, Mark, Phase, StopMode, mark
from .base import Mode, ResourceKind, ResourceTemplate, ToolContext, ToolOutput, ToolSpec, schema

BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
_ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"


class RunCommand:
    spec = ToolSpec(
        name="run_command",
        description=(
            "Run a program: `argv` is executed directly, without a shell. Runs in `cwd` "
            "inside the workspace with a scrubbed environment; stdout and stderr are "
            "captured. A non-zero exit is FAILURE/nonzero_exit with the output attached."
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
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                start_new_session=True,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError as exc:
            raise ToolError(
                ErrorClass.NOT_FOUND, f"program not found: {argv[0]}", field="arguments.argv[0]"
            ) from exc
        except PermissionError as exc:
            raise ToolError(
                ErrorClass.PERMISSION_DENIED, f"cannot execute {argv[0]}", field="arguments.argv[0]"
            ) from exc
        return await _supervise(proc, stdin, ctx)


async def _supervise(
    proc: asyncio.subprocess.Process, stdin: str | None, ctx: ToolContext
) -> ToolOutput:
    cap = ctx.limits.raw_cap_bytes
    assert proc.stdout is not None
    assert proc.stderr is not None
    async with asyncio.TaskGroup() as tg:
        out_task = tg.create_task(_drain(proc.stdout, cap))
        err_task = tg.create_task(_drain(proc.stderr, cap))
        if stdin is not None:
            tg.create_task(_feed(proc, stdin.encode()))
        stopped, marks, reason = await _wait_or_stop(proc, ctx)
        # Whatever the leader left behind in its group dies with the call, so it
        # cannot hold the output pipes open or outlive the call.
        _kill_group(proc.pid, signal.SIGKILL)
    out, out_total = out_task.result()
    err, err_total = err_task.result()
    return _output(proc.returncode, out, out_total, err, err_total, stopped, marks, reason)


async def _wait_or_stop(
    proc: asyncio.subprocess.Process, ctx: ToolContext
) -> tuple[StopMode, tuple[Mark, ...], ErrorClass]:
    """Wait for exit; on timeout or cancel: SIGTERM the group, wait the grace, SIGKILL."""
    waiter = asyncio.ensure_future(proc.wait())
    cancel = asyncio.ensure_future(ctx.cancel.requested.wait())
    try:
        done, _ = await asyncio.wait(
            {waiter, cancel}, timeout=ctx.timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter in done:
            return StopMode.COMPLETED, (), ErrorClass.NONE
        reason = ErrorClass.CANCELLED if cancel in done else ErrorClass.TIMEOUT
        marks = [mark(Phase.CANCEL_REQUESTED, ctx.cancel.reason or "timeout")]
        _kill_group(proc.pid, signal.SIGTERM)
        marks.append(mark(Phase.SIGNAL_SENT, "SIGTERM to process group"))
        try:
            await asyncio.wait_for(asyncio.shield(waiter), _grace(ctx))
            stopped = StopMode.COOPERATIVE
        except TimeoutError:
            marks.append(mark(Phase.GRACE_EXPIRED))
            _kill_group(proc.pid, signal.SIGKILL)
            marks.append(mark(Phase.FORCE_TERMINATED, "SIGKILL to process group"))
            await waiter
            stopped = StopMode.FORCE_TERMINATED
        marks.append(mark(Phase.STOPPED))
        return stopped, tuple(marks), reason
    finally:
        cancel.cancel()
        if not waiter.done():
            # Our own task is being cancelled (daemon shutdown): do not leave a process.
            _kill_group(proc.pid, signal.SIGKILL)
            waiter.cancel()


def _grace(ctx: ToolContext) -> float:
    asked = ctx.cancel.grace
    return ctx.limits.grace if asked is None else min(max(asked, 0.0), ctx.limits.max_grace)


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _drain(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, int]:
    """Keep the first `cap` bytes, count the rest."""
    kept = bytearray()
    total = 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        if len(kept) < cap:
            kept += chunk[: cap - len(kept)]
    return bytes(kept), total


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data)
        await proc.stdin.drain()
    proc.stdin.close()


def _output(
    code: int | None,
    out: bytes,
    out_total: int,
    err: bytes,
    err_total: int,
    stopped: StopMode,
    marks: tuple[Mark, ...],
    reason: ErrorClass,
) -> ToolOutput:
    stdout = out.decode("utf-8", errors="replace")
    stderr = err.decode("utf-8", errors="replace")
    text = stdout if not stderr else f"{stdout}\n[stderr]\n{stderr}" if stdout else stderr
    exit_code, sig = (code, None) if code is None or code >= 0 else (None, -code)
    error = reason
    message = ""
    if stopped is StopMode.COMPLETED and code != 0:
        error = ErrorClass.NONZERO_EXIT
        message = f"exited with status {code}" if sig is None else f"killed by signal {sig}"
    elif stopped is not StopMode.COMPLETED:
        message = f"{reason.value}: stopped {stopped.value}"
    return ToolOutput(
        text=text,
        structured={
            "exit_code": exit_code,
            "signal": sig,
            "stdout_bytes": out_total,
            "stderr_bytes": err_total,
        },
        evidence=Evidence(exit_code=exit_code, signal=sig),
        truncated=out_total > len(out) or err_total > len(err),
        total_bytes=out_total + err_total,
        error_class=error,
        message=message,
        stopped_how=stopped,
        marks=marks,
    )
