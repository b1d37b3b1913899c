"""A call's sandbox.run span id: derived while it runs, the same when its spans are built."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from execgate.executor.core.outcomes import Mark, Outcome, Phase, Status
from execgate.executor.telemetry.callspan import parent_for, run_span_id
from execgate.executor.telemetry.tracing import CallFacts, Tracing

SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _batch(*, sampled: bool = True, remote: bool = False) -> SpanContext:
    flags = SAMPLED if sampled else TraceFlags(TraceFlags.DEFAULT)
    state = TraceState([("vendor", "x")])
    return SpanContext(0x1234, 0xABCD, is_remote=remote, trace_flags=flags, trace_state=state)


def test_ids_are_distinct_per_call_and_batch_and_never_invalid() -> None:
    batches = (1, 2, 0xFFFF_FFFF_FFFF_FFFF)
    ids = {run_span_id(batch, index) for batch in batches for index in range(500)}
    assert len(ids) == 1500
    assert 0 not in ids
    assert run_span_id(7, 3) == run_span_id(7, 3)
    assert all(0 < i < 1 << 64 for i in ids)


def test_a_sampled_batch_of_this_daemon_names_the_calls_run_span() -> None:
    batch = _batch()
    parent = parent_for(batch, 4)
    assert parent is not None
    assert (parent.trace_id, parent.span_id) == (batch.trace_id, run_span_id(batch.span_id, 4))
    assert parent.trace_flags == batch.trace_flags
    assert parent.trace_state == batch.trace_state


def test_otherwise_the_batch_context_is_passed_on_as_it_is() -> None:
    unsampled, remote = _batch(sampled=False), _batch(remote=True)
    assert parent_for(unsampled, 1) is unsampled  # nothing recorded: nothing derived
    assert parent_for(remote, 1) is remote  # tracing off: the caller's own span
    invalid = SpanContext(0, 0, is_remote=False)
    assert parent_for(invalid, 1) is None


def test_the_recorded_run_span_has_the_derived_id() -> None:
    exported, tracing = _tracing()
    batch = tracing.batch_span((), "run", "b", "agent", 1)
    timeline = (Mark(Phase.QUEUED, 1.0), Mark(Phase.STARTED, 2.0), Mark(Phase.FINISHED, 3.0))
    outcome = Outcome(status=Status.SUCCESS, timeline=timeline)
    tracing.call_spans(batch, "run", "c", outcome, CallFacts(tool="t", index=2))
    batch.end()
    spans = {s.name: s for s in exported.get_finished_spans()}
    run = spans["execgate.sandbox.run"].get_span_context()
    expected = parent_for(batch.get_span_context(), 2)
    assert expected is not None
    assert run is not None
    assert (run.trace_id, run.span_id) == (expected.trace_id, expected.span_id)
    call = spans["execgate.call"].get_span_context()
    assert call is not None
    assert call.span_id != run.span_id


def _tracing(sampler: Sampler | None = None) -> tuple[InMemorySpanExporter, Tracing]:
    provider = TracerProvider(sampler=sampler)
    exported = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exported)
    provider.add_span_processor(processor)
    return exported, Tracing(provider, [processor], value_chars=16)
