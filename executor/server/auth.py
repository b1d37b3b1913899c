"""Authentication and role checks for every RPC: a grpc.aio server interceptor.

Who is calling comes only from the transport: a bearer token in the gRPC metadata
(`authorization: Bearer <token>`), else the subject CN of the mTLS client
certificate. Nothing in a request body can name the caller. An RPC then needs one
of the roles ACCESS gives it:

    unauthenticated or unknown caller      -> UNAUTHENTICATED
    known caller without one of the roles  -> PERMISSION_DENIED

Why an interceptor rather than a check at the top of each servicer method: it sees
every RPC of every service on the server (health, reflection, and services added
later), so a method nobody listed in ACCESS is admin-only instead of open. grpc.aio
hands an interceptor only the method name and metadata, not the ServicerContext
that carries the TLS peer, so the interceptor wraps the method's handler and the
check runs as the first step of the handler, with the context. The identity it
admits is handed to the servicer through a context variable (`caller()`): each RPC
is served in its own asyncio task, hence its own copy of the context.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any

import grpc

from execgate.executor.core.errors import ConfigError
from execgate.executor.policy.identity import LOCAL, Identities, Identity, Role

from .config import TlsFiles
from .guard import guarded
from .status import AccessRefused, PermissionDenied, Unauthenticated, abort_for

log = logging.getLogger("execgate.auth")

_EXECUTOR = "/execgate.v1.Executor/"
_RUNS = frozenset({Role.AGENT, Role.ADMIN})
# Reading the journal and cancelling: any agent, operator or admin. An agent cancels
# only its own calls and runs (services.ExecutorService.Cancel, inflight.NotYours).
_READS = frozenset({Role.AGENT, Role.OPERATOR, Role.ADMIN})
# The daemon's own state (ListProviders: a server's last error may quote its stderr):
# operators and admins, not agents.
_OPERATES = frozenset({Role.OPERATOR, Role.ADMIN})
_APPROVALS = "/execgate.v1.Approvals/"
_RUNS_SERVICE = "/execgate.v1.Runs/"
# Seeing what waits for a decision: approvers, operators, admins. Deciding: approvers
# and admins, and then only those the rule names, never the requester (approve.py).
_SEES_APPROVALS = frozenset({Role.APPROVER, Role.OPERATOR, Role.ADMIN})
_DECIDES = frozenset({Role.APPROVER, Role.ADMIN})
# No authentication at all: load balancers and `execgate health` probe these.
PUBLIC = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
# The roles each RPC needs (full gRPC method name -> any one of these roles).
ACCESS: Mapping[str, frozenset[Role]] = {
    _EXECUTOR + "ListTools": _RUNS,
    _EXECUTOR + "Execute": _RUNS,
    _EXECUTOR + "ExecuteBatch": _RUNS,
    _EXECUTOR + "Explain": _RUNS,
    # The policy's decision for a described call: agents for their own calls, and those
    # who read or decide calls for anyone's (services.ExecutorService.ExplainPolicy).
    _EXECUTOR + "ExplainPolicy": _RUNS | _SEES_APPROVALS,
    _EXECUTOR + "ListProviders": _OPERATES,
    _EXECUTOR + "GetCall": _READS,
    _EXECUTOR + "ListCalls": _READS,
    _EXECUTOR + "Cancel": _READS,
    _APPROVALS + "ListPending": _SEES_APPROVALS,
    _APPROVALS + "Watch": _SEES_APPROVALS,
    _APPROVALS + "Decide": _DECIDES,
    # A run's approvals, decided or not (traces): whoever may read the journal.
    _APPROVALS + "List": _READS | _SEES_APPROVALS,
    # A run's events are appended by its owner only; cancelling: the owner, or an
    # operator or admin (services_runs.py checks both).
    _RUNS_SERVICE + "StartRun": _RUNS,
    _RUNS_SERVICE + "AppendEvents": _RUNS,
    # A step appends (the owner only, as AppendEvents) and executes (as Execute).
    _RUNS_SERVICE + "Step": _RUNS,
    _RUNS_SERVICE + "StepBatch": _RUNS,
    _RUNS_SERVICE + "GetRun": _READS,
    _RUNS_SERVICE + "ListRuns": _READS,
    _RUNS_SERVICE + "WatchRun": _READS,
    _RUNS_SERVICE + "CancelRun": _READS,
}
# Any method not in ACCESS (server reflection, a service added later): admin only.
UNLISTED = frozenset({Role.ADMIN})

# Set by the interceptor before the servicer method runs; never set anywhere else.
_caller: ContextVar[Identity] = ContextVar("execgate_caller")


def caller() -> Identity:
    """The authenticated identity of the RPC being served.

    Raises LookupError where no interceptor admitted the RPC: fail closed.
    """
    return _caller.get()


# Why a caller is not admitted: `message` says what is missing, never the presented
# token; `code` is the status it is answered with (status.RULES).
Refusal = AccessRefused


def authenticate(
    identities: Identities | None,
    metadata: Iterable[tuple[str, str | bytes]],
    auth_context: Mapping[str, Iterable[bytes]],
) -> Identity | Refusal:
    """The caller's identity: from its token if it sent one, else its certificate."""
    if identities is None:
        return LOCAL  # no identities file: only the owner-only Unix socket listens
    values = [v for k, v in metadata if k.lower() == "authorization"]
    if len(values) > 1:
        return _unauthenticated("more than one 'authorization' metadata entry")
    if values:
        scheme, _, token = str(values[0]).partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _unauthenticated("'authorization' metadata is not 'Bearer <token>'")
        found = identities.by_token(token.strip())
        if found is None:
            return _unauthenticated("the token is not in the identities file (wrong or revoked)")
        return found
    names = [n.decode(errors="replace") for n in auth_context.get("x509_common_name", ())]
    if len(names) > 1:
        return _unauthenticated("the client certificate has more than one subject CN")
    if names:
        found = identities.by_cert_subject(names[0])
        if found is None:
            return _unauthenticated(
                f"no identity has cert_subject {names[0]!r} (the client certificate's CN)"
            )
        return found
    return _unauthenticated(
        "no credentials: send 'authorization: Bearer <token>' metadata "
        "(EXECGATE_TOKEN, --token) or a client certificate over TLS"
    )


def authorize(identity: Identity, method: str) -> Refusal | None:
    allowed = ACCESS.get(method, UNLISTED)
    if method in PUBLIC or identity.holds_any(allowed):
        return None
    return PermissionDenied(
        f"{identity.name} (roles: {', '.join(sorted(identity.roles))}) may not call "
        f"{method.rpartition('/')[2]}; it needs one of: {', '.join(sorted(allowed))}",
    )


def _unauthenticated(why: str) -> Refusal:
    return Unauthenticated(why)


Context = grpc.aio.ServicerContext[Any, Any]
Admit = Callable[[Context], Awaitable[None]]


# grpc-stubs make the interceptor generic; grpc.aio's class is not subscriptable.
class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Admits an RPC only for a caller holding one of the roles ACCESS gives its method."""

    def __init__(self, identities: Identities | None) -> None:
        self.identities = identities
        if identities is None:
            log.info("no identities file: Unix-socket callers are `local`, with every role")
        else:
            log.info("%d identities from %s", len(identities.entries), identities.source)
        # method -> its guarded handler; the server's handlers never change once it runs.
        self._guarded: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method
        wrapped = self._guarded.get(method)
        if wrapped is None:
            handler = await continuation(handler_call_details)
            if handler is None:  # no such method: grpc answers UNIMPLEMENTED
                return handler
            # One wrapper per method: admission (none for PUBLIC), then the request
            # guard's tolerant decoding and typed refusals (guard.py).
            admit = None if method in PUBLIC else self._admitter(method)
            wrapped = self._guarded[method] = guarded(handler, method, admit)
        return wrapped

    def _admitter(self, method: str) -> Admit:
        async def admit(context: Context) -> None:
            if self.identities is None:  # only the owner-only Unix socket listens
                _caller.set(LOCAL)  # every role (authorize would admit it anyway)
                return
            found = authenticate(
                self.identities, context.invocation_metadata() or (), context.auth_context()
            )
            refusal = found if isinstance(found, Refusal) else authorize(found, method)
            if refusal is not None:
                log.warning("refused %s from %s: %s", method, context.peer(), refusal.message)
                await abort_for(context, refusal)
            assert isinstance(found, Identity)
            _caller.set(found)

        return admit


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """mTLS for TCP listeners: our certificate, and client certificates required."""
    try:
        key, cert, ca = (p.read_bytes() for p in (tls.key, tls.cert, tls.client_ca))
    except OSError as exc:
        raise ConfigError(f"cannot read a TLS file: {exc}") from exc
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )
