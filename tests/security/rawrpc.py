"""Raw bytes to every RPC of a real daemon: a channel with identity serializers.

`RawClient.call(method, data)` sends `data` as the request, exactly as given (no
protobuf encoding on the way), and returns what the daemon answered as a `Reply`:
the status code, its details and the trailing metadata the daemon sets for a typed
refusal (`execgate-error-class`, `execgate-field`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from execgate.v1 import executor_pb2 as pb
from execgate.v1 import runs_pb2 as rpb
from tests.daemon import Daemon

SERVICES = [
    pb.DESCRIPTOR.services_by_name["Executor"],
    pb.DESCRIPTOR.services_by_name["Approvals"],
    rpb.DESCRIPTOR.services_by_name["Runs"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
]
METHODS: dict[str, MethodDescriptor] = {
    f"/{s.full_name}/{m.name}": m for s in SERVICES for m in s.methods
}
# Streams that may wait for something that never comes: read one message at most.
WATCHES = frozenset(
    {
        "/execgate.v1.Approvals/Watch",
        "/execgate.v1.Runs/WatchRun",
        "/grpc.health.v1.Health/Watch",
    }
)


def _identity(b: bytes) -> bytes:
    return b


@dataclass(frozen=True)
class Reply:
    code: grpc.StatusCode
    details: str
    trailers: dict[str, str]

    @property
    def error_class(self) -> str:
        return self.trailers.get("execgate-error-class", "")

    @property
    def field(self) -> str:
        return self.trailers.get("execgate-field", "")


class RawClient:
    def __init__(self, address: str, token: str = "") -> None:
        self.channel = grpc.insecure_channel(address)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def close(self) -> None:
        self.channel.close()

    def call(self, method: str, data: bytes | Message, *, timeout: float = 10.0) -> Reply:
        raw = data if isinstance(data, bytes) else data.SerializeToString()
        desc = METHODS[method]
        if desc.server_streaming:
            return self._stream(method, raw, 0.5 if method in WATCHES else timeout)
        rpc = self.channel.unary_unary(
            method, request_serializer=_identity, response_deserializer=_identity
        )
        try:
            rpc(raw, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            return _reply(exc)
        return Reply(grpc.StatusCode.OK, "", {})

    def _stream(self, method: str, raw: bytes, timeout: float) -> Reply:
        rpc = self.channel.unary_stream(
            method, request_serializer=_identity, response_deserializer=_identity
        )
        responses = rpc(raw, timeout=timeout, metadata=self.metadata)
        try:
            for _ in responses:
                if method in WATCHES:
                    responses.cancel()
                    return Reply(grpc.StatusCode.OK, "", {})
        except grpc.RpcError as exc:
            return _reply(exc)
        return Reply(grpc.StatusCode.OK, "", {})


def _reply(exc: grpc.RpcError) -> Reply:
    call: grpc.Call = exc  # type: ignore[assignment]
    trailers = {k: str(v) for k, v in (call.trailing_metadata() or ())}
    return Reply(call.code(), call.details() or "", trailers)


def module_daemon(factory: pytest.TempPathFactory, name: str) -> Iterator[Daemon]:
    """A plain daemon for one module of raw-request tests; stopped if still running."""
    d = Daemon(factory.mktemp(name)).start()
    yield d
    if d.proc is not None and d.proc.poll() is None:
        d.stop()
