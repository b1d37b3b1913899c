"""Services registered as generic handlers only.

grpc.aio's server asks the core for the next call of each *registered* method
separately, and its main loop waits on all those pending requests with one
`asyncio.wait(..., FIRST_COMPLETED)` per incoming RPC: with the daemon's ~25 methods
that is ~25 done-callbacks added and removed on every call (about 4 % of the
daemon's time under no-op load, `bench/dispatch.py --profile`). Registered as a
generic handler, a service's methods share the server's one pending request for
unregistered calls, and the method is found by a dict lookup.

The generated `add_*Servicer_to_server` functions register each service both ways
(a generic handler, then its methods); `GenericOnly` is the server they are given:
the generic handler is added, the per-method registration dropped. The daemon's
three services and health are registered this way; reflection (off by default)
registers its one method as usual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc


class GenericOnly:
    """The part of a grpc.aio server the generated registration functions use."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(
        self, handlers: Sequence[grpc.GenericRpcHandler[Any, Any]]
    ) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        """Dropped: the generic handler added just before serves the same methods."""
