"""Daemon errors to gRPC statuses: the one table, at the edge.

Every servicer and interceptor ends a refused RPC by handing an exception to
`abort_for`; none picks a status code itself. `RULES` says, per error class, which
code the RPC ends with, what its details say and which trailing metadata it carries:

    error (room)                      code                  details
    MalformedRequest (core)           INVALID_ARGUMENT      "CLASS: FIELD: message" (*)
    RunRefused (runs)                 by kind: NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
                                      INVALID_ARGUMENT; else FAILED_PRECONDITION
                                                            "KIND: FIELD: message" (*)
    ApprovalError (pipeline)          by refused: NOT_FOUND, FAILED_PRECONDITION,
                                      PERMISSION_DENIED     its message
    NotYours (pipeline)               PERMISSION_DENIED     its message
    Lagging (core)                    RESOURCE_EXHAUSTED    its message (says how to resume)
    Closing (runs)                    UNAVAILABLE           its message
    Unauthenticated (server)          UNAUTHENTICATED       its message
    PermissionDenied (server)         PERMISSION_DENIED     its message
    CallNotFound (server)             NOT_FOUND             its message
    BadArgument (server)              INVALID_ARGUMENT      its message (no trailers)
    OutcomesUnrecorded (server)       INTERNAL              the calls whose outcome is lost
    OutcomesDetached (server)         UNAVAILABLE           the calls parked across a restart
    NotImplementedError (builtin)     UNIMPLEMENTED         "METHOD is not implemented"
    anything else                     INTERNAL              "internal error in METHOD (TYPE);
                                                            see the daemon log" (class internal)

(*) with the class (or kind) and the field in the trailing metadata: `execgate-error-class`,
`execgate-field`. A class not in the table takes the rule of its nearest listed base.

The server's own refusals -- RPCs it ends without any lower room having raised -- are the
`RpcError` classes below (see the tree in `execgate.executor.core.errors`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from execgate.executor.core.errors import ExecgateError, MalformedRequest
from execgate.executor.core.fanout import Lagging
from execgate.executor.pipeline.approve import ApprovalError, Refused
from execgate.executor.pipeline.inflight import NotYours
from execgate.executor.runs.registry import Closing, Refusal, RunRefused

CLASS_KEY = "execgate-error-class"
FIELD_KEY = "execgate-field"
Code = grpc.StatusCode
Trailers = tuple[tuple[str, str], ...]


class RpcError(ExecgateError):
    """An RPC the server ends itself; `message` is the status's details."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def code(self) -> grpc.StatusCode:
        """The status this error ends its RPC with (from `RULES`)."""
        return rule_for(self).code(self)


class AccessRefused(RpcError):
    """The caller may not make this RPC at all (authentication or roles)."""


class Unauthenticated(AccessRefused):
    """The daemon does not know who calls: no, a wrong or a revoked credential."""


class PermissionDenied(AccessRefused):
    """A known caller without what the RPC needs (a role, or rights over another's calls)."""


class CallNotFound(RpcError):
    """GetCall of a call the journal does not have, or that the caller may not see."""

    def __init__(self, run_id: str, call_id: str) -> None:
        super().__init__(f"no call {call_id!r} in run {run_id!r}")
        self.run_id = run_id
        self.call_id = call_id


class BadArgument(RpcError):
    """A request field the servicer cannot use (answered without the class trailers a
    `MalformedRequest` carries); `field` is its name ("" when the cause did not say)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class OutcomesUnrecorded(RpcError):
    """The journal failed to record the outcome of `call_ids`: their effects are unknown."""

    def __init__(self, call_ids: Sequence[str]) -> None:
        super().__init__(
            f"the journal failed to record the outcome of call(s) {', '.join(call_ids)}: their "
            "effects are unknown until the journal recovers; reconcile with GetCall"
        )
        self.call_ids = tuple(call_ids)


class OutcomesDetached(RpcError):
    """The daemon stops while calls await approval: `parked` holds (call id, approval id)
    of each; the approvals stay pending across the restart."""

    def __init__(self, parked: Sequence[tuple[str, str]]) -> None:
        names = ", ".join(f"{call} (approval {approval})" for call, approval in parked)
        super().__init__(
            f"the daemon is shutting down while call(s) {names} await approval; the approvals "
            "stay pending, and once decided the calls run (or are rejected) on the restarted "
            "daemon: GetCall returns their outcomes"
        )
        self.parked = tuple(parked)


@dataclass(frozen=True, slots=True)
class Rule:
    """How one error class ends an RPC."""

    # The status code, from the error (some classes carry a kind that picks it).
    code: Callable[[Any], grpc.StatusCode]
    # The details, from the error and the RPC's full method name.
    details: Callable[[Any, str], str]
    # The trailing metadata; none for most.
    trailers: Callable[[Any], Trailers] = lambda _exc: ()


def _fixed(code: grpc.StatusCode) -> Callable[[Any], grpc.StatusCode]:
    return lambda _exc: code


def _text(exc: BaseException, _method: str) -> str:
    return str(exc)


def _message(exc: Any, _method: str) -> str:
    return str(exc.message)


_RUN_CODES: Mapping[Refusal, grpc.StatusCode] = {
    Refusal.NOT_FOUND: Code.NOT_FOUND,
    Refusal.EXISTS: Code.ALREADY_EXISTS,
    Refusal.FORBIDDEN: Code.PERMISSION_DENIED,
    Refusal.MALFORMED: Code.INVALID_ARGUMENT,
}
_APPROVAL_CODES: Mapping[Refused, grpc.StatusCode] = {
    Refused.NOT_FOUND: Code.NOT_FOUND,
    Refused.NOT_PENDING: Code.FAILED_PRECONDITION,
    Refused.FORBIDDEN: Code.PERMISSION_DENIED,
}


def _run_refusal(exc: RunRefused, _method: str) -> str:
    where = f"{exc.field}: " if exc.field and not exc.message.startswith(exc.field) else ""
    return f"{exc.kind.value}: {where}{exc.message}"


def _short(method: str) -> str:
    return method.rpartition("/")[2]


RULES: Mapping[type[BaseException], Rule] = {
    MalformedRequest: Rule(
        _fixed(Code.INVALID_ARGUMENT),
        _text,
        lambda e: ((CLASS_KEY, e.kind), (FIELD_KEY, e.field)),
    ),
    RunRefused: Rule(
        lambda e: _RUN_CODES.get(e.kind, Code.FAILED_PRECONDITION),
        _run_refusal,
        lambda e: ((CLASS_KEY, e.kind.value), (FIELD_KEY, e.field)),
    ),
    ApprovalError: Rule(lambda e: _APPROVAL_CODES[e.refused], _message),
    NotYours: Rule(_fixed(Code.PERMISSION_DENIED), _text),
    Lagging: Rule(_fixed(Code.RESOURCE_EXHAUSTED), _text),
    Closing: Rule(_fixed(Code.UNAVAILABLE), _text),
    Unauthenticated: Rule(_fixed(Code.UNAUTHENTICATED), _message),
    PermissionDenied: Rule(_fixed(Code.PERMISSION_DENIED), _message),
    CallNotFound: Rule(_fixed(Code.NOT_FOUND), _message),
    BadArgument: Rule(_fixed(Code.INVALID_ARGUMENT), _message),
    OutcomesUnrecorded: Rule(_fixed(Code.INTERNAL), _message),
    OutcomesDetached: Rule(_fixed(Code.UNAVAILABLE), _message),
    NotImplementedError: Rule(
        _fixed(Code.UNIMPLEMENTED), lambda _e, method: f"{method} is not implemented"
    ),
}
# Anything else: a bug. The details name the exception's type, never its text.
INTERNAL = Rule(
    _fixed(Code.INTERNAL),
    lambda e, method: (
        f"internal error in {_short(method)} ({type(e).__name__}); see the daemon log"
    ),
    lambda _e: ((CLASS_KEY, "internal"),),
)


def rule_for(exc: BaseException) -> Rule:
    """The rule of `exc`'s class, or of its nearest base in `RULES`; else `INTERNAL`."""
    for cls in type(exc).__mro__:
        rule = RULES.get(cls)
        if rule is not None:
            return rule
    return INTERNAL


async def abort_for(
    context: grpc.aio.ServicerContext[Any, Any], exc: BaseException, method: str = ""
) -> NoReturn:
    """End the RPC with `exc`'s status (`method`: the RPC's full name, for the rules
    that say it)."""
    rule = rule_for(exc)
    trailers = rule.trailers(exc)
    if trailers:
        await context.abort(rule.code(exc), rule.details(exc, method), trailing_metadata=trailers)
    else:
        await context.abort(rule.code(exc), rule.details(exc, method))
    raise AssertionError("context.abort returned")
