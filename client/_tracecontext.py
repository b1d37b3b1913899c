"""W3C trace context on every RPC: the daemon's spans join the caller's trace.

A client interceptor adds what the OpenTelemetry propagators (W3C `traceparent`,
`tracestate`, baggage by default; whatever `OTEL_PROPAGATORS` selects) inject for
the current context into the call's metadata. Without an active span, or without
an OpenTelemetry SDK installed, nothing is added.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from opentelemetry.propagate import inject


def _with_context(details: Any) -> Any:
    carrier: dict[str, str] = {}
    inject(carrier)
    if not carrier:
        return details
    metadata = [*(details.metadata or ()), *carrier.items()]
    return details._replace(metadata=metadata)


class TraceContext(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], details: Any, request: Any
    ) -> Any:
        return continuation(_with_context(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[[Any, Any], Any], details: Any, request: Any
    ) -> Any:
        return continuation(_with_context(details), request)


# grpc.aio files an interceptor under the first kind it is an instance of (an if/elif
# chain in its channel), so one class for both kinds intercepted unary calls only: the
# Execute stream went out without the caller's context. One class per kind.
class AioTraceContextUnary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], details: Any, request: Any
    ) -> Any:
        return await continuation(_with_context(details), request)


class AioTraceContextStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_stream(
        self, continuation: Callable[[Any, Any], Any], details: Any, request: Any
    ) -> Any:
        return await continuation(_with_context(details), request)


def aio_trace_context() -> list[Any]:
    """The interceptors that put the trace context on every RPC of an aio channel."""
    return [AioTraceContextUnary(), AioTraceContextStream()]
