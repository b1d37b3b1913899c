"""The daemon's metrics through the OpenTelemetry SDK, exported over OTLP when the
standard `OTEL_*` variables ask for it (OTEL_METRICS_EXPORTER=otlp, or an OTLP
endpoint), every OTEL_METRIC_EXPORT_INTERVAL ms:

    execgate.calls                  counter: calls finished, by status, tool, error.type
    execgate.call.lock_wait         histogram (s): queued behind conflicting calls
    execgate.call.duration          histogram (s): the tool's run, start to stop
    execgate.forced_terminations    counter: calls whose grace ran out, by tool
    execgate.approvals.pending      gauge: calls parked for a human now
    execgate.queue.depth            gauge: calls in the daemon not yet started

Recorded from each finished call's outcome (the same hook that builds its spans).

Every label comes from a closed set, never from what a client typed: status and
error.type are enums, and `execgate.tool` is a tool the daemon serves, else
UNKNOWN_TOOL ("unknown": a bogus name), and past MAX_TOOL_LABELS distinct tools
OTHER_TOOL. A client sending a million distinct tool names adds one series.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader

from execgate.executor.core.outcomes import Outcome, Phase

from . import otel_env as otelenv
from .otel_env import disabled

log = logging.getLogger("execgate.metrics")

Gauge = Callable[[], int]

# The label of a call naming a tool this daemon does not serve.
UNKNOWN_TOOL = "unknown"
# Distinct `execgate.tool` labels kept; calls of tools past it share OTHER_TOOL.
MAX_TOOL_LABELS = 256
OTHER_TOOL = "other"


class Metrics:
    def __init__(self, provider: MeterProvider | None, tools: Iterable[str] = ()) -> None:
        self.provider = provider
        # The label each served tool gets (the first MAX_TOOL_LABELS by name).
        self._labels = {t: t for t in sorted(tools)[:MAX_TOOL_LABELS]}
        self._overflow = frozenset(sorted(tools)[MAX_TOOL_LABELS:])
        meter: Meter = (provider or NoOpMeterProvider()).get_meter("execgate.executor")
        self._calls = meter.create_counter("execgate.calls", "{call}", "calls finished")
        self._lock_wait = meter.create_histogram(
            "execgate.call.lock_wait", "s", "time queued behind conflicting calls"
        )
        self._duration = meter.create_histogram(
            "execgate.call.duration", "s", "the tool's run, from start to its last process's end"
        )
        self._forced = meter.create_counter(
            "execgate.forced_terminations", "{call}", "calls force-terminated after the grace"
        )
        self._meter = meter

    def gauges(self, pending_approvals: Gauge, queue_depth: Gauge) -> None:
        """Observed at each export: what the dispatcher holds now."""
        self._meter.create_observable_gauge(
            "execgate.approvals.pending", [_observe(pending_approvals)], "{call}"
        )
        self._meter.create_observable_gauge(
            "execgate.queue.depth", [_observe(queue_depth)], "{call}"
        )

    def tool_label(self, tool: str) -> str:
        """What `tool` is labelled with: its name if served, else a shared bucket."""
        found = self._labels.get(tool)
        if found is not None:
            return found
        return OTHER_TOOL if tool in self._overflow else UNKNOWN_TOOL

    def record(self, tool: str, outcome: Outcome) -> None:
        tool = self.tool_label(tool)
        attrs = {"execgate.tool": tool, "execgate.outcome.status": outcome.status.value}
        if outcome.error_class.value != "none":
            attrs["error.type"] = outcome.error_class.value
        self._calls.add(1, attrs)
        marks = {m.phase: m.at for m in outcome.timeline}
        tool_only = {"execgate.tool": tool}
        if Phase.WAITING in marks and Phase.LOCK_GRANTED in marks:
            self._lock_wait.record(marks[Phase.LOCK_GRANTED] - marks[Phase.WAITING], tool_only)
        if Phase.STARTED in marks:
            end = marks.get(Phase.STOPPED, marks.get(Phase.FINISHED, marks[Phase.STARTED]))
            self._duration.record(max(end - marks[Phase.STARTED], 0.0), tool_only)
        if Phase.FORCE_TERMINATED in marks:
            self._forced.add(1, tool_only)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def setup(
    instance: str, readers: Iterable[MetricReader] = (), tools: Iterable[str] = ()
) -> Metrics:
    """Metrics to the configured exporters (plus `readers`, for tests); else no-ops.
    `tools`: the names the daemon serves (the only tool labels)."""
    if disabled():
        return Metrics(None, tools)
    chosen = list(readers)
    for name, exporter in otelenv.exporters("metrics"):
        chosen.append(PeriodicExportingMetricReader(exporter))
        log.info("metrics: exported to %s", name)
    if not chosen:
        return Metrics(None, tools)
    provider = MeterProvider(resource=otelenv.resource(instance), metric_readers=chosen)
    return Metrics(provider, tools)


def _observe(read: Gauge) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(read())]

    return callback
