"""OpenTelemetry for the daemon: spans for every batch and call, exported to the
journal always and over OTLP when the standard `OTEL_*` variables ask for it.

A call's spans are built when it finishes, from the same timeline the journal
records (its marks), so a trace and `GetCall` always agree on when things
happened, and the hot path pays nothing until the end:

    execgate.batch                 one per Execute; parent: the caller's span (W3C
    └─ execgate.call               trace context in the gRPC metadata)
       ├─ execgate.policy          deciding the call
       ├─ execgate.approval_wait   parked by an `ask` rule until decided
       ├─ execgate.lock_wait       queued behind conflicting calls
       └─ execgate.sandbox.run     the tool, from start to its last process's end
       events: cancel_requested, signal_sent, grace_expired, force_terminated, stopped

One id is known before the spans are built: `execgate.sandbox.run`'s, derived from
its batch span's id and the call's index (callspan.py), so an MCP server's spans can
name it as their parent while the call runs.

Exporting never slows or fails a call: both exporters sit behind batch processors
(their own threads, bounded queues that drop when full: MAX_QUEUED_SPANS). Every
attribute value is cut to MAX_ATTRIBUTE_CHARS (paths, cancel reasons and other
client-chosen text), so a queued span's size is bounded too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from execgate.executor.core.outcomes import Mark, Outcome, Phase
from execgate.executor.core.outcomes import Status as OutcomeStatus
from execgate.executor.journal.base import SpanStore

from . import otel_env as otelenv
from .callspan import CallSpanIds, run_span_id
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


class Tracing:
    """The daemon's tracer; `shutdown` flushes (to the journal, then OTLP)."""

    def __init__(self, provider: TracerProvider | None, ids: CallSpanIds | None = None) -> None:
        self.provider = provider
        self._ids = ids  # the provider's id generator (None: ids are all random)
        source = provider if provider is not None else trace.NoOpTracerProvider()
        self.tracer = source.get_tracer("execgate.executor")

    def batch_span(
        self, metadata: Sequence[tuple[str, Any]], run_id: str, batch_id: str, agent: str, n: int
    ) -> Span:
        """The span of one Execute, child of the caller's span if it sent one."""
        parent = extract({k: v for k, v in metadata if isinstance(v, str)})
        return self.tracer.start_span(
            "execgate.batch",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "execgate.run_id": run_id,
                "execgate.batch_id": batch_id,
                "execgate.agent": agent,
                "execgate.batch.calls": n,
                "rpc.system": "grpc",
                "rpc.service": "execgate.v1.Executor",
                "rpc.method": "Execute",
            },
        )

    def call_spans(
        self, parent: Span | None, run_id: str, call_id: str, outcome: Outcome, facts: CallFacts
    ) -> None:
        """The call's span tree, from its timeline (nothing if its batch is not sampled)."""
        if parent is not None and not parent.get_span_context().trace_flags.sampled:
            return
        marks = {m.phase: m for m in outcome.timeline}
        first, last = _bounds(outcome.timeline)
        ctx = trace.set_span_in_context(parent) if parent is not None else Context()
        span = self.tracer.start_span(
            "execgate.call",
            context=ctx,
            start_time=_ns(first),
            attributes=_attributes(run_id, call_id, outcome, facts),
        )
        child = trace.set_span_in_context(span)
        if facts.policy_span is not None:
            self._child(
                "execgate.policy",
                child,
                *facts.policy_span,
                {
                    "execgate.policy.effect": facts.policy_effect,
                    "execgate.policy.rule_ids": list(facts.policy_rules),
                },
            )
        if facts.approval is not None:
            start, end, about = facts.approval
            self._child("execgate.approval_wait", child, start, end, dict(about))
        waiting, granted = marks.get(Phase.WAITING), marks.get(Phase.LOCK_GRANTED)
        if waiting is not None and granted is not None:
            self._child(
                "execgate.lock_wait",
                child,
                waiting.at,
                granted.at,
                {
                    "execgate.lock.blocked_by": waiting.detail,
                },
            )
        started = marks.get(Phase.STARTED)
        if started is not None:
            end = marks.get(Phase.STOPPED, marks.get(Phase.FINISHED, started)).at
            if self._ids is not None and parent is not None:
                self._ids.reserve(run_span_id(parent.get_span_context().span_id, facts.index))
            self._child(
                "execgate.sandbox.run",
                child,
                started.at,
                end,
                {
                    "execgate.sandbox.backend": outcome.evidence.sandbox,
                },
            )
        for phase in LADDER:
            if phase in marks:
                m = marks[phase]
                span.add_event(f"execgate.{phase.value}", {"detail": m.detail}, _ns(m.at))
        if outcome.status not in _OK:
            span.set_status(Status(StatusCode.ERROR, outcome.error_class.value))
        span.end(end_time=_ns(last))

    def _child(
        self, name: str, ctx: Context, start: float, end: float, attributes: dict[str, Any]
    ) -> None:
        attrs = {k: v for k, v in attributes.items() if v not in ("", None, [])}
        span = self.tracer.start_span(name, context=ctx, start_time=_ns(start), attributes=attrs)
        span.end(end_time=_ns(max(end, start)))

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def setup(journal: SpanStore, instance: str) -> Tracing:
    """The daemon's tracing: the journal always; OTLP when `OTEL_*` configures it.
    OTEL_SDK_DISABLED=true turns both off."""
    if disabled():
        return Tracing(None)
    limit = None if "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT" in os.environ else MAX_ATTRIBUTE_CHARS
    ids = CallSpanIds()
    provider = TracerProvider(
        resource=otelenv.resource(instance),
        span_limits=SpanLimits(max_attribute_length=limit),
        id_generator=ids,
    )
    provider.add_span_processor(_batched(JournalSpanExporter(journal)))
    for name, exporter in otelenv.exporters("traces"):
        provider.add_span_processor(_batched(exporter))
        how = f"otlp, {otelenv.otlp_protocol('traces')}" if name == "otlp" else name
        log.info("traces: journal and %s", how)
    return Tracing(provider, ids)


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


def _bounds(timeline: Sequence[Mark]) -> tuple[float, float]:
    times = [m.at for m in timeline] or [0.0]
    return min(times), max(times)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
