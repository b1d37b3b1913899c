"""The standard OpenTelemetry environment, read the way the SDK and the specification do.

- The resource: `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` win over the daemon's
  own defaults (`service.name=execgate`, `service.instance.id=<daemon id>`), through the
  SDK's own detector.
- Exporters: `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER` are comma-separated names
  resolved through the SDK's exporter entry points (`opentelemetry_traces_exporter`, ...):
  `otlp` (gRPC or HTTP by `OTEL_EXPORTER_OTLP[_<SIGNAL>]_PROTOCOL`), `console`, or anything an
  installed package registers; `none` exports nothing. An unknown name stops the daemon at
  startup with the names it knows.
- One departure, on purpose: with the variable unset the specification's default is `otlp`;
  the daemon exports over OTLP only when an OTLP endpoint is configured, since a daemon with
  no collector would otherwise log a failed export every few seconds forever. The journal
  always keeps the spans (`execgate trace` needs no collector).
- `OTEL_SDK_DISABLED=true` turns everything off.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from typing import Any

from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from execgate.executor.core.errors import ConfigError

_PROTOCOLS = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


def disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def resource(instance: str) -> Resource:
    """The daemon's resource: its defaults, then whatever the environment says."""
    ours = Resource.create({"service.name": "execgate", "service.instance.id": instance})
    return ours.merge(OTELResourceDetector().detect())


def exporter_names(signal: str) -> list[str]:
    """The exporters `signal` ("traces" or "metrics") goes to, by name, in order."""
    if disabled():
        return []
    upper = signal.upper()
    raw = os.environ.get(f"OTEL_{upper}_EXPORTER", "").strip().lower()
    if not raw:
        return ["otlp"] if _endpoint(upper) else []
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return [] if "none" in names else list(dict.fromkeys(names))


def exporters(signal: str) -> list[tuple[str, Any]]:
    """(name, exporter instance) for each exporter `signal` is configured to use."""
    return [(name, _load(signal, name)()) for name in exporter_names(signal)]


def otlp_protocol(signal: str) -> str:
    upper = signal.upper()
    protocol = (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"  # the Python SDK's default for `otlp`
    ).strip()
    if protocol not in _PROTOCOLS:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not one of {sorted(_PROTOCOLS)}"
        )
    return protocol


def _endpoint(upper: str) -> bool:
    return bool(
        os.environ.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def _load(signal: str, name: str) -> Any:
    group = f"opentelemetry_{signal}_exporter"
    wanted = _PROTOCOLS[otlp_protocol(signal)] if name == "otlp" else name
    found = entry_points(group=group, name=wanted)
    if not found:
        known = sorted({"otlp", "none"} | {e.name for e in entry_points(group=group)})
        raise ConfigError(
            f"OTEL_{signal.upper()}_EXPORTER: no exporter named {name!r} is installed "
            f"(known here: {', '.join(known)})"
        )
    return next(iter(found)).load()
