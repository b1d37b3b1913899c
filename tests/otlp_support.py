"""A real OTLP receiver for tests: the collector's gRPC TraceService and
MetricsService (from opentelemetry-proto) on loopback, keeping what they are sent."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mpb_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tpb_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[tuple[str, int, dict[str, Any]], ...]
    status_code: int
    # The resource the span came with (service.name, service.instance.id, ...).
    resource: dict[str, Any] = field(default_factory=dict)


@dataclass
class Receiver(tpb_grpc.TraceServiceServicer):
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def Export(self, request: tpb.ExportTraceServiceRequest, context: Any) -> Any:
        got = [s for rs in request.resource_spans for s in _spans(rs)]
        with self.lock:
            self.spans.extend(got)
        return tpb.ExportTraceServiceResponse()

    def named(self, name: str, service: str = "") -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name and service in ("", s.service)]


@dataclass
class MetricsReceiver(mpb_grpc.MetricsServiceServicer):
    # Every data point received: (metric name, attributes, value; a histogram's count).
    points: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def Export(self, request: mpb.ExportMetricsServiceRequest, context: Any) -> Any:
        got = [
            p
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            for p in _points(m)
        ]
        with self.lock:
            self.points.extend(got)
        return mpb.ExportMetricsServiceResponse()

    def latest(self, name: str) -> list[tuple[dict[str, Any], float]]:
        """The points of `name` in the last export that had it (metrics are cumulative)."""
        with self.lock:
            mine = [(a, v) for n, a, v in self.points if n == name]
        return mine


def start_receiver() -> tuple[grpc.Server, Receiver, int]:
    server, receiver, _, port = start_receivers()
    return server, receiver, port


def start_receivers() -> tuple[grpc.Server, Receiver, MetricsReceiver, int]:
    receiver, metrics = Receiver(), MetricsReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    tpb_grpc.add_TraceServiceServicer_to_server(receiver, server)
    mpb_grpc.add_MetricsServiceServicer_to_server(metrics, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, receiver, metrics, port


def _points(metric: Any) -> list[tuple[str, dict[str, Any], float]]:
    kind = metric.WhichOneof("data")
    data = getattr(metric, kind)
    out = []
    for p in data.data_points:
        if kind == "histogram":
            value = float(p.count)
        else:
            value = float(p.as_int if p.WhichOneof("value") == "as_int" else p.as_double)
        out.append((metric.name, _attrs(p.attributes), value))
    return out


def _spans(resource_spans: Any) -> list[ReceivedSpan]:
    resource = _attrs(resource_spans.resource.attributes)
    service = str(resource.get("service.name", ""))
    out = []
    for scope in resource_spans.scope_spans:
        for s in scope.spans:
            out.append(
                ReceivedSpan(
                    service=service,
                    name=s.name,
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex(),
                    start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano,
                    attributes=_attrs(s.attributes),
                    events=tuple(
                        (e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events
                    ),
                    status_code=s.status.code,
                    resource=resource,
                )
            )
    return out


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None
