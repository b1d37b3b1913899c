"""A real OTLP trace receiver for tests: the collector's gRPC TraceService (from
opentelemetry-proto) on loopback, keeping every span it is sent."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
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


def start_receiver() -> tuple[grpc.Server, Receiver, int]:
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    tpb_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, receiver, port


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
