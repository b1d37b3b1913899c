"""The spans of a batch and its calls, built whole from the timeline (tracing.py):
their tree, the caller's trace, the sampler's decision, attribute limits."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Sampler
from opentelemetry.trace import SpanKind, StatusCode, TraceFlags

from execgate.executor.core.outcomes import ErrorClass, Evidence, Mark, Outcome, Phase, Status
from execgate.executor.telemetry.tracing import CallFacts, Tracing

CALLER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN = 0xB7AD6B7169203331


def _tracing(sampler: Sampler | None = None) -> tuple[InMemorySpanExporter, Tracing]:
    provider = TracerProvider(sampler=sampler)
    exported = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exported)
    provider.add_span_processor(processor)
    return exported, Tracing(provider, [processor], value_chars=16)


def _traceparent(flags: str = "01") -> tuple[tuple[str, str], ...]:
    return (("traceparent", f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-{flags}"),)


def _outcome() -> Outcome:
    timeline = (
        Mark(Phase.QUEUED, 10.0),
        Mark(Phase.WAITING, 10.1, "behind run/a"),
        Mark(Phase.LOCK_GRANTED, 10.2),
        Mark(Phase.STARTED, 10.3),
        Mark(Phase.CANCEL_REQUESTED, 10.4, "x" * 100),
        Mark(Phase.STOPPED, 10.5),
        Mark(Phase.FINISHED, 10.6),
    )
    return Outcome(
        status=Status.FAILURE,
        error_class=ErrorClass.CANCELLED,
        timeline=timeline,
        evidence=Evidence(sandbox="bwrap", exit_code=143),
    )


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def test_a_call_is_a_tree_under_its_batch_and_the_callers_span() -> None:
    exported, tracing = _tracing()
    batch = tracing.batch_span(_traceparent(), "run", "b1", "agent", 1)
    facts = CallFacts(
        tool="t",
        agent="agent",
        resources=(("file:/w/a", "write"),),
        policy_effect="allow",
        policy_rules=("r1",),
        policy_span=(10.0, 10.01),
    )
    tracing.call_spans(batch, "run", "c1", _outcome(), facts)
    batch.end()
    spans = _by_name(exported.get_finished_spans())
    assert set(spans) == {
        "execgate.batch",
        "execgate.call",
        "execgate.policy",
        "execgate.lock_wait",
        "execgate.sandbox.run",
    }
    b, call = spans["execgate.batch"], spans["execgate.call"]
    assert b.context is not None
    assert call.context is not None
    assert b.context.trace_id == CALLER_TRACE
    assert b.parent is not None
    assert b.parent.span_id == CALLER_SPAN
    assert b.kind is SpanKind.SERVER
    assert call.parent is not None
    assert call.parent.span_id == b.context.span_id
    for name in ("execgate.policy", "execgate.lock_wait", "execgate.sandbox.run"):
        child = spans[name]
        assert child.parent is not None
        assert child.parent.span_id == call.context.span_id
        assert child.context is not None
        assert child.context.trace_id == CALLER_TRACE
    assert call.start_time == 10_000_000_000
    assert call.end_time == 10_600_000_000
    assert spans["execgate.lock_wait"].attributes["execgate.lock.blocked_by"] == "behind run/a"
    assert call.status.status_code is StatusCode.ERROR
    assert call.attributes["error.type"] == "cancelled"
    assert call.attributes["process.exit.code"] == 143
    assert call.attributes["execgate.resource.keys"] == ("file:/w/a",)
    assert [e.name for e in call.events] == ["execgate.cancel_requested", "execgate.stopped"]


def test_attribute_values_are_cut_to_the_limit() -> None:
    exported, tracing = _tracing()
    batch = tracing.batch_span((), "r" * 40, "b", "agent", 1)
    facts = CallFacts(tool="t" * 40, resources=(("k" * 40, "read"),))
    tracing.call_spans(batch, "run", "c", _outcome(), facts)
    batch.end()
    spans = _by_name(exported.get_finished_spans())
    call = spans["execgate.call"]
    assert call.attributes["execgate.tool"] == "t" * 16
    assert call.attributes["execgate.resource.keys"] == ("k" * 16,)
    assert call.events[0].attributes is not None
    assert call.events[0].attributes["detail"] == "x" * 16
    assert spans["execgate.batch"].attributes["execgate.run_id"] == "r" * 16


def test_an_unsampled_batch_records_nothing_and_passes_its_decision_on() -> None:
    exported, tracing = _tracing(ALWAYS_OFF)
    batch = tracing.batch_span((), "run", "b", "agent", 1)
    tracing.call_spans(batch, "run", "c", _outcome(), CallFacts())
    batch.end()
    assert exported.get_finished_spans() == ()
    context = batch.get_span_context()
    assert context.is_valid
    assert not context.trace_flags.sampled


def test_a_caller_that_does_not_sample_is_followed() -> None:
    exported, tracing = _tracing()  # parent-based: the caller decides
    batch = tracing.batch_span(_traceparent("00"), "run", "b", "agent", 1)
    tracing.call_spans(batch, "run", "c", _outcome(), CallFacts())
    batch.end()
    assert exported.get_finished_spans() == ()
    assert batch.get_span_context().trace_id == CALLER_TRACE


def test_with_tracing_off_the_callers_context_passes_through() -> None:
    tracing = Tracing(None)
    batch = tracing.batch_span(_traceparent(), "run", "b", "agent", 1)
    context = batch.get_span_context()
    assert (context.trace_id, context.span_id) == (CALLER_TRACE, CALLER_SPAN)
    assert context.is_remote
    tracing.call_spans(batch, "run", "c", _outcome(), CallFacts())  # records nothing
    batch.end()
    assert not Tracing(None).batch_span((), "run", "b", "agent", 1).get_span_context().is_valid


def test_a_batch_of_this_daemon_sets_the_random_trace_id_flag_as_the_sdk_does() -> None:
    _, tracing = _tracing()
    flags = tracing.batch_span((), "run", "b", "agent", 1).get_span_context().trace_flags
    assert flags.sampled
    assert flags & getattr(TraceFlags, "RANDOM_TRACE_ID", 0) == getattr(
        TraceFlags, "RANDOM_TRACE_ID", 0
    )
