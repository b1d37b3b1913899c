"""The trace context a call's `tools/call` carries in `_meta` (W3C `traceparent`,
`tracestate`), and the same context made current around the SDK's send.

The parent the server sees is the call's `execgate.sandbox.run` span (its id is
derived while the call runs: telemetry/callspan.py), so the server's spans nest
under the span of the tool's run in the call's trace.

Two writers, one value: `meta` puts the context into `_meta`, and the `mcp` SDK's
dispatcher injects the *current* OpenTelemetry context into `_meta` itself
(SEP-414), overwriting ours. Both read the one context `current` builds, which
calling.py makes current in the request's task, so they never disagree. (The
daemon sets no global tracer provider: the SDK's own "MCP send" span is then a
non-recording span carrying that same context. A process that sets one would see
the SDK's client span, a child of the call's, as the server's parent.)
"""

from __future__ import annotations

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext

from execgate.executor.telemetry.callspan import parent_for

from ..base import ToolContext


def for_call(ctx: ToolContext) -> SpanContext | None:
    """The span a call's server works under; None: the call is not traced."""
    return None if ctx.trace is None else parent_for(ctx.trace, ctx.call_index)


def current(parent: SpanContext | None) -> Context:
    """The OpenTelemetry context current around the call's send: its span, or nothing
    (never whatever context the daemon's task happens to have)."""
    if parent is None:
        return Context()
    return trace.set_span_in_context(NonRecordingSpan(parent), Context())


def meta(current: Context) -> dict[str, str] | None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=current)
    return carrier or None
