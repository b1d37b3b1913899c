"""An OTLP receiver that keeps nothing but counts: a daemon under long hostile load
exports every span and metric somewhere real, and the test process does not grow.

It remembers, per metric, the attribute sets of the last export only (what the
cardinality tests look at)."""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mpb_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tpb_grpc


class _Traces(tpb_grpc.TraceServiceServicer):
    def __init__(self, sink: OtlpSink) -> None:
        self.sink = sink

    def Export(self, request: tpb.ExportTraceServiceRequest, context: Any) -> Any:
        n = sum(len(s.spans) for rs in request.resource_spans for s in rs.scope_spans)
        with self.sink.lock:
            self.sink.spans += n
        return tpb.ExportTraceServiceResponse()


class _Metrics(mpb_grpc.MetricsServiceServicer):
    def __init__(self, sink: OtlpSink) -> None:
        self.sink = sink

    def Export(self, request: mpb.ExportMetricsServiceRequest, context: Any) -> Any:
        seen: dict[str, set[tuple[tuple[str, str], ...]]] = {}
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    data = getattr(m, m.WhichOneof("data"))
                    seen[m.name] = {
                        tuple(sorted((kv.key, str(kv.value).strip()) for kv in p.attributes))
                        for p in data.data_points
                    }
        with self.sink.lock:
            self.sink.exports += 1
            self.sink.attribute_sets.update(seen)
        return mpb.ExportMetricsServiceResponse()


class OtlpSink:
    """OTLP/gRPC traces and metrics on loopback; `env()` points a daemon at it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans = 0
        self.exports = 0
        # metric name -> the attribute sets of its points in the last export that had it.
        self.attribute_sets: dict[str, set[tuple[tuple[str, str], ...]]] = {}
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        tpb_grpc.add_TraceServiceServicer_to_server(_Traces(self), self._server)
        mpb_grpc.add_MetricsServiceServicer_to_server(_Metrics(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    def __enter__(self) -> OtlpSink:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)

    def env(self, interval_ms: int = 1000) -> dict[str, str]:
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_METRIC_EXPORT_INTERVAL": str(interval_ms),
        }
