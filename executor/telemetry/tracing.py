"""OpenTelemetry for the daemon: spans for every batch and call, exported to the
journal always and over OTLP when the standard `OTEL_*` variables ask for it.

A call's spans are built when it finishes, from the same timeline the journal
records (its marks), so a trace and `GetCall` always agree on when things
happened, and the hot path pays nothing until the end. Since every span is known
whole when it is made, each is built at once as the SDK's finished span
(`ReadableSpan`) and handed to the span processors: none goes through a live SDK
span (sampler, id generator, attribute checks, start and end hooks), which cost
about 30 us a span on this path; the sampler is asked once per batch:

    execgate.batch                 one per Execute; parent: the caller's span (W3C
    └─ execgate.call               trace context in the gRPC metadata)
       ├─ execgate.policy          deciding the call
       ├─ execgate.approval_wait   parked by an `ask` rule until decided
       ├─ execgate.lock_wait       queued behind conflicting calls
       └─ execgate.sandbox.run     the tool, from start to its last process's end
       events: cancel_requested, signal_sent, grace_expired, force_terminated, stopped

One id is known before the spans are built: `execgate.sandbox.run`'s, derived from
its batch span's id and the call's index (callspan.py), so an MCP server's spans can
name it as their parent while the call runs. The batch span's own context is drawn
when the batch starts (the caller's trace, the sampler's decision) and the span is
recorded when the batch ends.

Exporting never slows or fails a call: both exporters sit behind batch processors
(their own threads, bounded queues that drop when full: MAX_QUEUED_SPANS). Every
attribute value is cut to MAX_ATTRIBUTE_CHARS (paths, cancel reasons and other
client-chosen text), so a queued span's size is bounded too.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from execgate.executor.core.outcomes import Mark, Outcome, Phase
from execgate.executor.core.outcomes import Status as OutcomeStatus
from execgate.executor.journal.base import SpanStore

from . import otel_env as otelenv
from .callspan import run_span_id
from .journal_exporter import JournalSpanExporter
from .otel_env import disabled

log = logging.getLogger("execgate.tracing")

LADDER = (
    Phase.CANCEL_REQUESTED,
    Phase.SIGNAL_SENT,
    Phase.GRACE_EXPIRED,
    Phase.FORCE_TERMINATED,
    Phase.STOPPED,
)
_OK = (OutcomeStatus.SUCCESS, OutcomeStatus.PARTIAL)
# Spans waiting for each exporter; more are dropped (the SDK logs it). A call makes
# 2-5 spans: a second of a busy daemon's calls. OTEL_BSP_MAX_QUEUE_SIZE wins.
MAX_QUEUED_SPANS = 8192
# Longest attribute value (span and event) kept; longer values are cut.
# OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT wins.
MAX_ATTRIBUTE_CHARS = 1024
_SCOPE = InstrumentationScope("execgate.executor")
_UNSET = Status(StatusCode.UNSET)
# W3C trace context level 2's "random trace id" flag, set as the SDK sets it (0 in an
# SDK that predates it).
_RANDOM = int(getattr(TraceFlags, "RANDOM_TRACE_ID", 0))


@dataclass(slots=True)
class CallFacts:
    """What the dispatcher knows about a call beyond its outcome (all optional)."""

    tool: str = ""
    agent: str = ""
    index: int = 0  # the call's position in its batch (callspan.run_span_id)
    resources: tuple[tuple[str, str], ...] = ()  # (key, mode)
    policy_effect: str = ""
    policy_rules: tuple[str, ...] = ()
    policy_span: tuple[float, float] | None = None  # epoch seconds
    approval: tuple[float, float, Mapping[str, str]] | None = None


class BatchSpan:
    """One Execute's `execgate.batch` span: its context is known from the start (what
    the batch's calls pass on), the span is recorded when `end` is called."""

    __slots__ = ("_attributes", "_context", "_ended", "_parent", "_start", "_tracing")

    def __init__(
        self,
        context: SpanContext,
        parent: SpanContext | None = None,
        attributes: dict[str, Any] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._context = context
        self._parent = parent
        self._attributes = attributes or {}
        # None: not recorded (unsampled, or tracing off).
        self._tracing = tracing
        self._start = time.time_ns()
        self._ended = False

    def get_span_context(self) -> SpanContext:
        return self._context

    @property
    def recorded(self) -> bool:
        return self._tracing is not None

    def end(self) -> None:
        """Ends the span now; on an event loop it is built and handed on just after the
        current step (the batch's reply is then on its way: never delayed by it)."""
        if self._tracing is None or self._ended:
            return
        self._ended = True
        emit = functools.partial(
            self._tracing.emit,
            "execgate.batch",
            self._context,
            self._parent,
            self._start,
            max(time.time_ns(), self._start),
            self._attributes,
            kind=SpanKind.SERVER,
        )
        try:
            asyncio.get_running_loop().call_soon(emit)
        except RuntimeError:  # no running loop: at once
            emit()


class Tracing:
    """The daemon's spans; `shutdown` flushes (to the journal, then OTLP)."""

    def __init__(
        self,
        provider: TracerProvider | None,
        processors: Sequence[SpanProcessor] = (),
        *,
        value_chars: int | None = None,
    ) -> None:
        self.provider = provider
        # Where finished spans go (each also added to the provider, which shuts it down).
        self._processors = tuple(processors)
        self._value_chars = value_chars  # the longest attribute value kept (None: any)
        self._resource = provider.resource if provider is not None else Resource.get_empty()

    def batch_span(
        self, metadata: Sequence[tuple[str, Any]], run_id: str, batch_id: str, agent: str, n: int
    ) -> BatchSpan:
        """The span of one Execute, child of the caller's span if it sent one."""
        carrier = {k: v for k, v in metadata if isinstance(v, str)}
        parent_ctx = extract(carrier)  # on an empty context: never the task's own
        caller = trace.get_current_span(parent_ctx).get_span_context()
        provider = self.provider
        if provider is None:  # tracing off: the caller's context passes through as is
            return BatchSpan(caller)
        parent = caller if caller.is_valid else None
        trace_id = (
            parent.trace_id if parent is not None else provider.id_generator.generate_trace_id()
        )
        attributes: dict[str, Any] = {
            "execgate.run_id": run_id,
            "execgate.batch_id": batch_id,
            "execgate.agent": agent,
            "execgate.batch.calls": n,
            "rpc.system": "grpc",
            "rpc.service": "execgate.v1.Executor",
            "rpc.method": "Execute",
        }
        decided = provider.sampler.should_sample(
            parent_ctx, trace_id, "execgate.batch", SpanKind.SERVER, attributes
        )
        sampled = decided.decision is Decision.RECORD_AND_SAMPLE  # the SDK's is_sampled()
        flags = TraceFlags(_flags(sampled, parent, provider.id_generator))
        span_id = provider.id_generator.generate_span_id()
        context = SpanContext(
            trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=decided.trace_state
        )
        if not sampled:
            return BatchSpan(context)
        attributes.update(decided.attributes or {})
        return BatchSpan(context, parent, attributes, self)

    def call_spans(
        self,
        parent: BatchSpan | None,
        run_id: str,
        call_id: str,
        outcome: Outcome,
        facts: CallFacts,
    ) -> None:
        """The call's span tree, from its timeline (nothing if its batch is not recorded)."""
        if self.provider is None or (parent is not None and not parent.recorded):
            return
        batch = parent.get_span_context() if parent is not None else None
        trace_id = batch.trace_id if batch is not None else self._trace_id()
        ids = self._ids()
        call = self._context(batch, trace_id, ids.generate_span_id())
        marks = {m.phase: m for m in outcome.timeline}
        first, last = _bounds(outcome.timeline)
        if facts.policy_span is not None:
            start, end = facts.policy_span
            about = {
                "execgate.policy.effect": facts.policy_effect,
                "execgate.policy.rule_ids": list(facts.policy_rules),
            }
            self._child("execgate.policy", call, start, end, about)
        if facts.approval is not None:
            start, end, approval = facts.approval
            self._child("execgate.approval_wait", call, start, end, dict(approval))
        waiting, granted = marks.get(Phase.WAITING), marks.get(Phase.LOCK_GRANTED)
        if waiting is not None and granted is not None:
            about = {"execgate.lock.blocked_by": waiting.detail}
            self._child("execgate.lock_wait", call, waiting.at, granted.at, about)
        started = marks.get(Phase.STARTED)
        if started is not None:
            end = marks.get(Phase.STOPPED, marks.get(Phase.FINISHED, started)).at
            run_id_ = run_span_id(batch.span_id, facts.index) if batch is not None else 0
            about = {"execgate.sandbox.backend": outcome.evidence.sandbox}
            self._child("execgate.sandbox.run", call, started.at, end, about, run_id_)
        events = [
            Event(f"execgate.{phase.value}", self._bounded({"detail": m.detail}), _ns(m.at))
            for phase in LADDER
            if (m := marks.get(phase)) is not None
        ]
        status = _UNSET
        if outcome.status not in _OK:
            status = Status(StatusCode.ERROR, outcome.error_class.value)
        attributes = _attributes(run_id, call_id, outcome, facts)
        self.emit("execgate.call", call, batch, _ns(first), _ns(last), attributes, events, status)

    def emit(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        start: int,
        end: int,
        attributes: dict[str, Any],
        events: Sequence[Event] = (),
        status: Status = _UNSET,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> None:
        """A finished span, handed to every span processor (its exporters' queues)."""
        span = ReadableSpan(
            name,
            context,
            parent,
            self._resource,
            self._bounded(attributes),
            events,
            kind=kind,
            status=status,
            start_time=start,
            end_time=end,
            instrumentation_scope=_SCOPE,
        )
        for processor in self._processors:
            processor.on_end(span)

    def _child(
        self,
        name: str,
        parent: SpanContext,
        start: float,
        end: float,
        attributes: dict[str, Any],
        span_id: int = 0,
    ) -> None:
        attrs = {k: v for k, v in attributes.items() if v not in ("", None, [])}
        context = self._context(parent, parent.trace_id, span_id or self._ids().generate_span_id())
        self.emit(name, context, parent, _ns(start), _ns(max(end, start)), attrs)

    @staticmethod
    def _context(parent: SpanContext | None, trace_id: int, span_id: int) -> SpanContext:
        """A span's context under `parent` (sampled, as recorded spans are: their
        flags and state are the batch's, as a parent-based sampler gives them)."""
        if parent is None:
            return SpanContext(trace_id, span_id, False, TraceFlags(TraceFlags.SAMPLED | _RANDOM))
        return SpanContext(trace_id, span_id, False, parent.trace_flags, parent.trace_state)

    def _ids(self) -> Any:
        assert self.provider is not None
        return self.provider.id_generator

    def _trace_id(self) -> int:
        return int(self._ids().generate_trace_id())

    def _bounded(self, attributes: dict[str, Any]) -> dict[str, Any]:
        """`attributes` (a dict built for this span) with values cut to the limit:
        strings, and strings in lists (lists become tuples, as the SDK makes them)."""
        limit = self._value_chars
        for key, value in attributes.items():
            if isinstance(value, str):
                if limit is not None and len(value) > limit:
                    attributes[key] = value[:limit]
            elif isinstance(value, list | tuple):
                attributes[key] = tuple(
                    v[:limit] if limit is not None and isinstance(v, str) else v for v in value
                )
        return attributes

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def setup(journal: SpanStore, instance: str) -> Tracing:
    """The daemon's tracing: the journal always; OTLP when `OTEL_*` configures it.
    OTEL_SDK_DISABLED=true turns both off."""
    if disabled():
        return Tracing(None)
    limit = None if "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT" in os.environ else MAX_ATTRIBUTE_CHARS
    limits = SpanLimits(max_attribute_length=limit)
    provider = TracerProvider(resource=otelenv.resource(instance), span_limits=limits)
    processors = [_batched(JournalSpanExporter(journal))]
    for name, exporter in otelenv.exporters("traces"):
        processors.append(_batched(exporter))
        how = f"otlp, {otelenv.otlp_protocol('traces')}" if name == "otlp" else name
        log.info("traces: journal and %s", how)
    for processor in processors:
        provider.add_span_processor(processor)
    return Tracing(provider, processors, value_chars=limits.max_span_attribute_length)


def _batched(exporter: SpanExporter) -> BatchSpanProcessor:
    """A batch processor sized for a daemon (MAX_QUEUED_SPANS). OTEL_BSP_* variables,
    when set, win."""
    env = os.environ
    return BatchSpanProcessor(
        exporter,
        max_queue_size=None if "OTEL_BSP_MAX_QUEUE_SIZE" in env else MAX_QUEUED_SPANS,
        schedule_delay_millis=None if "OTEL_BSP_SCHEDULE_DELAY" in env else 500,
        max_export_batch_size=None if "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in env else 2048,
    )


def _attributes(run_id: str, call_id: str, o: Outcome, facts: CallFacts) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "execgate.run_id": run_id,
        "execgate.call_id": call_id,
        "execgate.tool": facts.tool,
        "execgate.agent": facts.agent,
        "execgate.outcome.status": o.status.value,
        "execgate.stopped_how": o.stopped_how.value,
        "execgate.resource.keys": [k for k, _ in facts.resources],
        "execgate.resource.modes": [m for _, m in facts.resources],
        "execgate.policy.effect": facts.policy_effect,
        "execgate.policy.rule_ids": list(facts.policy_rules),
        "execgate.sandbox.backend": o.evidence.sandbox,
    }
    if o.status not in _OK:
        attrs["error.type"] = o.error_class.value
    if o.evidence.exit_code is not None:
        attrs["process.exit.code"] = o.evidence.exit_code
    return {k: v for k, v in attrs.items() if v not in ("", [], None)}


def _flags(sampled: bool, parent: SpanContext | None, ids: Any) -> int:
    """A new span's trace flags, as the SDK's tracer sets them."""
    if parent is not None:
        random = bool(parent.trace_flags & _RANDOM)
    else:
        random = bool(getattr(ids, "is_trace_id_random", lambda: False)())
    return (TraceFlags.SAMPLED if sampled else 0) | (_RANDOM if random else 0)


def _bounds(timeline: Sequence[Mark]) -> tuple[float, float]:
    times = [m.at for m in timeline] or [0.0]
    return min(times), max(times)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
