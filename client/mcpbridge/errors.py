"""Exceptions of the MCP bridge.

    ExecgateClientError          root of the client (execgate.client.errors)
    └── BridgeError              root of execgate.client.mcpbridge
        ├── NotLoopback          an HTTP listen address that is not a loopback one
        │                        (`host`)
        ├── BadMeta              a tools/call whose `_meta` carries an execgate key
        │                        of the wrong shape (`key`, `why`); answered as a
        │                        JSON-RPC invalid-params error, never sent on
        └── StreamEnded          the daemon's Execute stream ended without the call's
                                 outcome; answered as a JSON-RPC internal error

A call the daemon refuses or that fails is never an exception: it is an Outcome, and
the MCP client gets it as a result with `isError: true`.
"""

from __future__ import annotations

from ..errors import ExecgateClientError


class BridgeError(ExecgateClientError):
    """Root of the MCP bridge's exceptions."""


class NotLoopback(BridgeError):
    """Streamable HTTP is served on loopback only: anyone who reaches the port acts
    with the bridge's identity."""

    def __init__(self, host: str) -> None:
        super().__init__(
            f"--http {host!r}: not a loopback address; the bridge serves HTTP on 127.0.0.1, "
            "::1 or localhost only (whoever reaches the port calls tools as its identity)"
        )
        self.host = host


class BadMeta(BridgeError):
    def __init__(self, key: str, why: str) -> None:
        super().__init__(f'_meta["{key}"]: {why}')
        self.key = key
        self.why = why


class StreamEnded(BridgeError):
    """The daemon's Execute stream ended without the call's outcome."""
