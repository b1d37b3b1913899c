"""Reading the standard OpenTelemetry environment for the daemon's exporters."""

from __future__ import annotations

import importlib
import os
from typing import Any

# signal -> (module under opentelemetry.exporter.otlp.proto.<grpc|http>, class).
_EXPORTERS = {
    "traces": ("trace_exporter", "OTLPSpanExporter"),
    "metrics": ("metric_exporter", "OTLPMetricExporter"),
}


def otlp_protocol(signal: str) -> str | None:
    """The OTLP protocol ("grpc" or "http/protobuf") to export `signal` ("traces" or
    "metrics") with, or None for no OTLP export: OTEL_<SIGNAL>_EXPORTER=otlp, or an
    OTLP endpoint set while that variable is unset. OTEL_SDK_DISABLED=true: None."""
    if disabled():
        return None
    upper = signal.upper()
    chosen = os.environ.get(f"OTEL_{upper}_EXPORTER", "").strip().lower()
    endpoint = os.environ.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if chosen not in ("otlp", "") or (chosen == "" and not endpoint):
        return None
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    )


def disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def otlp_exporter(signal: str) -> Any:
    """The OTLP exporter of `signal` (gRPC or HTTP, configured by the OTEL_* variables),
    or None when OTLP is not asked for."""
    protocol = otlp_protocol(signal)
    if protocol is None:
        return None
    module, name = _EXPORTERS[signal]
    transport = "grpc" if protocol == "grpc" else "http"
    return getattr(
        importlib.import_module(f"opentelemetry.exporter.otlp.proto.{transport}.{module}"), name
    )()
