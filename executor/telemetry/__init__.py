"""The telemetry room: OpenTelemetry traces and metrics of the daemon.

Spans for every batch and call (`tracing`), the daemon's metrics (`metrics`), the standard
OTEL_* environment read as the SDK reads it (`otel_env`), and an exporter of spans into the
journal, so traces exist without a collector. The SDK is heavy: its modules are imported
directly, where they are needed, so `__all__` is empty.
"""

__all__: list[str] = []
