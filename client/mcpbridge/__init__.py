"""execgate as an MCP server: `execgate mcp` serves a daemon's tools to any MCP client.

    from execgate.client.mcpbridge import BridgeConfig, serve_stdio
    anyio.run(serve_stdio, BridgeConfig(address="unix:var/execgate.sock"))

A thin bridge (docs/mcp-bridge.md): `tools/list` is the daemon's ListTools with
annotations from each tool's effects, every `tools/call` an Execute under the bridge's
identity (so policy, approvals, scheduling, sandbox, journal and traces apply unchanged),
`notifications/cancelled` a Cancel. It needs the official `mcp` SDK
(`pip install 'execgate[mcp]'`); `execgate.client` itself never imports it.
"""

from .bridge import Bridge, BridgeConfig
from .errors import BadMeta, BridgeError, NotLoopback, StreamEnded
from .keys import IDEMPOTENCY_META
from .serve import serve_http, serve_stdio

__all__ = [
    "IDEMPOTENCY_META",
    "BadMeta",
    "Bridge",
    "BridgeConfig",
    "BridgeError",
    "NotLoopback",
    "StreamEnded",
    "serve_http",
    "serve_stdio",
]
