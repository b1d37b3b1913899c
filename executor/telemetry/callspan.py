"""The id of a call's `execgate.sandbox.run` span, known while the call runs.

A call's spans are built when its outcome is recorded (tracing.py), but a tool that
passes the trace on while it runs (an MCP server's `_meta.traceparent`) must name a
span of the call as the parent then. So that span's id is not drawn at random like
the others: it is `run_span_id(batch span id, index of the call in its batch)`, a
bijective mix (splitmix64's finalizer), the same at the call's start and when its
spans are built. Distinct calls of one batch get distinct ids; calls of different
batches differ by their batch span's random id. Nothing is kept between the two
moments, and a call whose tool passes nothing on costs nothing until its spans are
built (where the mix replaces a random draw).

tracing.py builds each span whole when the call's outcome is recorded, so it simply
gives the `execgate.sandbox.run` span this id; every other id is drawn at random.
"""

from __future__ import annotations

from opentelemetry.trace import SpanContext

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def run_span_id(batch_span_id: int, index: int) -> int:
    """The span id of call `index`'s `execgate.sandbox.run` in the batch `batch_span_id`."""
    z = (batch_span_id + (index + 1) * _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) or 1  # 0 is the invalid span id


def parent_for(batch: SpanContext, index: int) -> SpanContext | None:
    """What a running call names as the parent of work it hands on (a `traceparent`).

    The call's `execgate.sandbox.run` span when its batch's span is this daemon's and
    sampled (the call's spans will be recorded). Otherwise the batch's context as it
    is: unsampled (it tells the callee nothing is recorded, and nothing is derived),
    or the caller's own span when the daemon's tracing is off (OTEL_SDK_DISABLED: the
    batch "span" is then the caller's context, remote). None: no trace at all.
    """
    if not batch.is_valid:
        return None
    if batch.is_remote or not batch.trace_flags.sampled:
        return batch
    return SpanContext(
        batch.trace_id,
        run_span_id(batch.span_id, index),
        is_remote=False,
        trace_flags=batch.trace_flags,
        trace_state=batch.trace_state,
    )
