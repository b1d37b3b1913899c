"""How the client reaches the daemon and says who it is: channels, TLS, the bearer token."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ._tracecontext import TraceContext, aio_trace_context
from .wire import CHANNEL_OPTIONS

TOKEN_ENV = "EXECGATE_TOKEN"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM files for an mTLS connection to a daemon's TCP listener.

    Args:
        ca: the CA that signed the daemon's certificate.
        cert: this client's certificate; the daemon maps its subject CN to an identity.
        key: the private key of `cert`.
        server_name: the name to check the daemon's certificate against, when it is
            not the host of the address ("" = the host).
    """

    ca: str | Path
    cert: str | Path
    key: str | Path
    server_name: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        """Reads the files (OSError if one cannot be read)."""
        return grpc.ssl_channel_credentials(
            root_certificates=Path(self.ca).read_bytes(),
            private_key=Path(self.key).read_bytes(),
            certificate_chain=Path(self.cert).read_bytes(),
        )

    def options(self) -> list[tuple[str, Any]]:
        extra = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        return [*CHANNEL_OPTIONS, *extra]


def resolve_token(token: str | None, address: str = "") -> str:
    """`token`, else $EXECGATE_TOKEN, else the agent token a local daemon keeps beside
    its Unix socket (`make run`: var/tokens/agent.token, owner-only), else "" (none:
    fine on a daemon without identities)."""
    chosen = os.environ.get(TOKEN_ENV, "") if token is None else token
    if token is None and not chosen and address.startswith("unix:"):
        chosen = _local_agent_token(address.removeprefix("unix:"))
    return chosen.strip()


def _local_agent_token(socket: str) -> str:
    path = os.path.join(os.path.dirname(socket), "tokens", "agent.token")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Sent with every call. Never logged or put in an exception by this package."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def sync_channel(address: str, tls: TlsConfig | None) -> grpc.Channel:
    """A channel that sends the caller's trace context with every call."""
    if tls is None:
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    else:
        channel = grpc.secure_channel(address, tls.credentials(), options=tls.options())
    return grpc.intercept_channel(channel, TraceContext())


def aio_channel(address: str, tls: TlsConfig | None) -> grpc.aio.Channel:
    interceptors: Any = aio_trace_context()  # grpc-stubs type this parameter as a cast-me
    if tls is None:
        return grpc.aio.insecure_channel(
            address, options=CHANNEL_OPTIONS, interceptors=interceptors
        )
    return grpc.aio.secure_channel(
        address, tls.credentials(), options=tls.options(), interceptors=interceptors
    )
