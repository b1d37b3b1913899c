"""One `tools/call` on a live connection, stopped through the cancel ladder.

    CANCEL_REQUESTED  the Cancel's arrival, or the deadline
    SIGNAL_SENT       `notifications/cancelled` for the request (the SDK sends it
                      when the waiting request is abandoned): the cooperative step
    STOPPED           within the grace, evidence that the call's work ended
                      -> COOPERATIVE
    GRACE_EXPIRED     no such evidence within the grace
    FORCE_TERMINATED  the server's whole process tree killed; it is started anew
                      for later calls -> FORCE_TERMINATED
    STOPPED           with the count of survivors

What counts as evidence depends on what the call may do:

- a call that may write: the server's answer (a result or an error) to that very
  request, seen even after the SDK stopped waiting for it (answers.py). Nothing
  else proves that its handler ended: both SDKs never answer a request after its
  cancel (the spec says not to), and a server that answers pings may still be
  running the handler (the Python SDK waits for a sync tool's worker thread, the
  TypeScript SDK only aborts a signal the handler may ignore). Releasing the
  call's locks then would let the next writer run over a write still under way.
  So a writer's call that a server-side handler does not answer is force-
  terminated after the grace, and the server restarts for later calls.
- a read-only call: the answer, or a ping answered within the grace (the server
  reads its stdin again, so it has the cancellation). Its handler may still run
  (see above), but a reader changes nothing: its READ claims released early let a
  writer run beside work whose result is dropped. Killing the server (and every
  other call on it) for that would cost more than it protects.

A server that dies mid-call, or whose session ends under it (a message over the
server's `max_message_kb`): INTERRUPTED (UNKNOWN_OUTCOME for a writer, FAILURE
for a reader), never an RPC error.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import mcp.types as mcp_types
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanContext

from execgate.executor.core import clock
from execgate.executor.core.outcomes import ErrorClass, Evidence, Mark, Phase, StopMode, mark
from execgate.executor.sandbox.ladder import grace_for

from ..base import ToolContext, ToolOutput
from . import tracecontext
from .answers import EXPECTED, Expected
from .connection import Connection
from .outputs import OutputMismatch
from .results import to_output

# How long a "connection closed" waits for the connection to see the process end.
CLOSED_SETTLE_SECONDS = 1.0
# Why a stop is COOPERATIVE (the STOPPED mark's detail).
ANSWERED = "the server answered the request: its work ended"
PINGED = "read-only call: the server answered a ping (it has the cancellation)"
# Kill the server's tree and forget its connection; returns the survivors' count.
ForceRestart = Callable[[Connection, str], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class Call:
    server: str
    tool: str
    where: str  # the sandbox, for the evidence
    # The span the server's work is a child of (tracecontext.py); None: no trace.
    trace: SpanContext | None = None


async def call(
    conn: Connection, what: Call, args: dict[str, Any], ctx: ToolContext, force: ForceRestart
) -> ToolOutput:
    session = conn.session
    if session is None:
        return await _crashed(conn, what)
    expected = conn.answers.expect()
    current = tracecontext.current(what.trace)
    sent = session.call_tool(
        what.tool,
        args,
        progress_callback=_reporter(ctx),
        meta=tracecontext.meta(current),  # type: ignore[arg-type]  # the SDK's TypedDict
    )
    request = _start(sent, expected, current)
    asked = asyncio.ensure_future(ctx.cancel.requested.wait())
    died = asyncio.ensure_future(conn.closed.wait())
    started = clock.now()
    limit = ctx.remaining()
    try:
        done, _ = await asyncio.wait(
            {request, asked, died}, timeout=limit, return_when=asyncio.FIRST_COMPLETED
        )
        if request in done:
            return await _answered(conn, what, request)
        if died in done:
            request.cancel()
            return await _crashed(conn, what)
        first = _first_mark(ctx, asked in done, started, limit)
        return await _stop(conn, what, (request, expected), ctx, first, force)
    finally:
        conn.answers.forget(expected)
        for task in (request, asked, died):
            task.cancel()


def not_sent(server: str, ctx: ToolContext, started: float, limit: float) -> ToolOutput:
    """The call's deadline or a cancel came while its server was still starting: the
    request was never sent, so nothing can have changed (FAILURE even for a writer).
    The start goes on for later calls."""
    first, reason = _first_mark(ctx, ctx.cancel.requested.is_set(), started, limit)
    why = f"MCP server {server} was still starting; the call was never sent"
    return ToolOutput(
        error_class=reason,
        message=f"{reason.value}: {why}",
        stopped_how=StopMode.NOT_STARTED,
        marks=(first, mark(Phase.STOPPED, why)),
        rolled_back=True,
    )


def _start(
    sent: Coroutine[Any, Any, Any], expected: Expected, current: otel_context.Context
) -> asyncio.Task[Any]:
    """The request's task, in a context of its own: the SDK's dispatcher reads the id to
    send it under (answers.EXPECTED) and injects the current trace context into `_meta`
    itself, so the call's trace context is made current there (the same as `meta`)."""
    context = contextvars.copy_context()
    context.run(EXPECTED.set, expected)
    context.run(otel_context.attach, current)
    return asyncio.get_running_loop().create_task(sent, context=context)


def _reporter(ctx: ToolContext) -> ProgressFnT:
    """The SDK's progress callback: the server's notifications/progress for this call."""

    async def report(progress: float, total: float | None, message: str | None) -> None:
        ctx.progress(progress, total, message or "")

    return report


async def _answered(conn: Connection, what: Call, request: asyncio.Future[Any]) -> ToolOutput:
    exc = request.exception()
    if exc is None:
        result = request.result()
        if not isinstance(result, mcp_types.CallToolResult):
            return _failed(what, ErrorClass.INTERNAL, f"unexpected result {type(result).__name__}")
        return to_output(result, what.where)
    if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
        # The SDK's "connection closed" -- or a server's own error with that code: the
        # connection tells which, as soon as it has seen the stream end.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(conn.closed.wait(), CLOSED_SETTLE_SECONDS)
    if conn.closed.is_set():
        return await _crashed(conn, what)
    if isinstance(exc, MCPError):  # a JSON-RPC error: the server refused or failed the call
        return _failed(what, ErrorClass.TOOL_ERROR, f"{what.server}: {exc}")
    if isinstance(exc, OutputMismatch):  # it answered, but not as its outputSchema says
        return _failed(what, ErrorClass.TOOL_ERROR, f"{what.server}.{what.tool}: {exc}")
    return _failed(what, ErrorClass.INTERNAL, f"{what.server}: {type(exc).__name__}: {exc}")


def _first_mark(
    ctx: ToolContext, cancelled: bool, started: float, limit: float
) -> tuple[Mark, ErrorClass]:
    scope = ctx.cancel
    if cancelled:
        by = f" (requested by {scope.requester})" if scope.requester else ""
        reason = ErrorClass.TIMEOUT if scope.timed_out else ErrorClass.CANCELLED
        return Mark(Phase.CANCEL_REQUESTED, scope.requested_at, f"{scope.reason}{by}"), reason
    at = started + limit
    return Mark(Phase.CANCEL_REQUESTED, at, f"timeout after {ctx.timeout:g}s"), ErrorClass.TIMEOUT


async def _stop(
    conn: Connection,
    what: Call,
    sent: tuple[asyncio.Future[Any], Expected],
    ctx: ToolContext,
    first: tuple[Mark, ErrorClass],
    force: ForceRestart,
) -> ToolOutput:
    start, reason = first
    request, expected = sent
    request.cancel()  # the SDK writes notifications/cancelled for it (bounded, shielded)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await request
    marks = [start, mark(Phase.SIGNAL_SENT, f"notifications/cancelled to {what.server}")]
    grace = grace_for(ctx.cancel, ctx.limits.grace, ctx.limits.max_grace)
    ended = await _ended(conn, expected, ctx, grace)
    if ended:
        marks.append(mark(Phase.STOPPED, ended))
        return _interrupted(what, reason, StopMode.COOPERATIVE, marks, 0)
    if ctx.cancel.forced.is_set():
        expired = "forced: no grace"
    elif conn.closed.is_set():
        expired = f"the server ended within {grace:g}s without answering"
    else:
        expired = f"after {grace:g}s without " + ("an answer" if ctx.may_write else "a ping")
    marks.append(mark(Phase.GRACE_EXPIRED, expired))
    marks.append(mark(Phase.FORCE_TERMINATED, f"{what.server}: {conn.running.description}"))
    left = await force(conn, f"call stopped: {reason.value}")
    detail = f"{left} survived" if left else "no process of the server is left"
    marks.append(mark(Phase.STOPPED, detail + "; the server starts anew for later calls"))
    return _interrupted(what, reason, StopMode.FORCE_TERMINATED, marks, left)


async def _ended(conn: Connection, expected: Expected, ctx: ToolContext, grace: float) -> str:
    """Why the call's work is known to have ended within the grace, or "" (module doc)."""
    if expected.answered.is_set():
        return ANSWERED
    if grace <= 0 or ctx.cancel.forced.is_set():
        return ""
    answered = asyncio.ensure_future(expected.answered.wait())
    # A reader may also be let go on a ping (module doc); a writer only on its answer.
    ping = None if ctx.may_write else asyncio.ensure_future(conn.ping(grace))
    forced = asyncio.ensure_future(ctx.cancel.forced.wait())
    closed = asyncio.ensure_future(conn.closed.wait())
    waiting = {answered, forced, closed} | ({ping} if ping is not None else set())
    try:
        await asyncio.wait(waiting, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (answered, forced, closed, ping):
            if task is not None:
                task.cancel()
    if ctx.cancel.forced.is_set():
        return ""
    if expected.answered.is_set():
        return ANSWERED
    if ping is not None and ping.done() and not ping.cancelled() and ping.result():
        return PINGED
    return ""


def _interrupted(
    what: Call, reason: ErrorClass, how: StopMode, marks: list[Mark], left: int
) -> ToolOutput:
    return ToolOutput(
        evidence=Evidence(sandbox=what.where, survivors=left),
        error_class=reason,
        message=f"{reason.value}: stopped {how.value}",
        stopped_how=how,
        marks=tuple(marks),
    )


async def _crashed(conn: Connection, what: Call) -> ToolOutput:
    """The server ended under the call. Its outcome (and the release of its locks) waits
    for the server's tree to be killed and reaped: a process of it may still run (the
    session ended on a message over the bound, a child outlived the server)."""
    left = await conn.kill()  # the connection's one kill, begun when it closed
    why = conn.error or "the connection closed"
    detail = f"server {what.server} ended: {why}" + (f"; {left} survived" if left else "")
    return ToolOutput(
        evidence=Evidence(sandbox=what.where, survivors=left),
        error_class=ErrorClass.INTERRUPTED,
        message=f"MCP server {what.server} ended mid-call: {why}",
        stopped_how=StopMode.INTERRUPTED,
        marks=(mark(Phase.STOPPED, detail),),
    )


def _failed(what: Call, error: ErrorClass, message: str) -> ToolOutput:
    return ToolOutput(evidence=Evidence(sandbox=what.where), error_class=error, message=message)
