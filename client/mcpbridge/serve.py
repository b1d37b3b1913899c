"""Serving the bridge: over stdio (what MCP clients launch), or streamable HTTP on loopback.

Over stdio (stdio.py: the SDK's framing on the event loop's pipes), stdout carries the
protocol only; everything the bridge says goes to stderr (logging's default). The bridge
ends when the client closes its stdin.

Over HTTP the listener is loopback only (NotLoopback otherwise): whoever reaches the port
calls tools with the bridge's identity, so it must not be reachable from elsewhere, and
the SDK's DNS-rebinding protection (Host and Origin checked against loopback names) keeps
a web page in a local browser out.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

import uvicorn
from mcp.server.transport_security import TransportSecuritySettings

from .bridge import Bridge, BridgeConfig
from .drain import answered_first
from .errors import NotLoopback
from .stdio import served_stdio

__all__ = ["loopback", "serve_http", "serve_stdio"]

# The path the streamable HTTP endpoint is served at (the SDK's default).
HTTP_PATH = "/mcp"


async def serve_stdio(config: BridgeConfig) -> None:
    """Serve one MCP connection on this process's stdin/stdout until the client closes it."""
    async with (
        Bridge(config) as bridge,
        served_stdio() as streams,
        answered_first(*streams) as (read, write),
    ):
        await bridge.server.run(read, write, bridge.server.create_initialization_options())


async def serve_http(
    config: BridgeConfig, host: str, port: int, ready: Callable[[str], None]
) -> None:
    """Serve streamable HTTP on `host`:`port` (0: any free port) until interrupted;
    `ready` gets the endpoint's URL once the socket listens."""
    family = loopback(host)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        bound = sock.getsockname()[1]
        async with Bridge(config) as bridge:
            name = f"[{host}]" if family == socket.AF_INET6 else host
            app = bridge.server.streamable_http_app(
                streamable_http_path=HTTP_PATH, host=host, transport_security=_guard(name, bound)
            )
            server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
            ready(f"http://{name}:{bound}{HTTP_PATH}")
            await server.serve(sockets=[sock])


def _guard(name: str, port: int) -> TransportSecuritySettings:
    """Only requests addressed to this listener by a loopback name, from no web page but
    one served by it (DNS rebinding: a page of another site resolving to 127.0.0.1)."""
    hosts = [f"{h}:{port}" for h in dict.fromkeys((name, "127.0.0.1", "localhost", "[::1]"))]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts],
    )


def loopback(host: str) -> socket.AddressFamily:
    """The address family to listen on `host` with; NotLoopback unless `host` is
    127.0.0.0/8, ::1 or localhost."""
    if host == "localhost":
        return socket.AF_INET
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise NotLoopback(host) from None
    if not address.is_loopback:
        raise NotLoopback(host)
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET
