"""Exceptions of the client.

    ExecgateClientError            root
    ├── DaemonUnavailable          nothing answers at the address (carries `address`)
    ├── CallNotFound               GetCall for an id the journal does not have
    ├── ApprovalNotPending         approve/deny of an approval that does not exist or is
    │                              no longer pending (decided or expired)
    ├── Unauthenticated            the daemon does not know who we are: no token, a wrong or
    │                              revoked one, or an unknown client certificate
    ├── PermissionDenied           our identity lacks the role the RPC needs
    ├── RunNotFound                a Runs call for a run the daemon does not have
    ├── RunRefused                 the daemon refused a run change: `kind` is gap, duplicate,
    │                              discontinuous, illegal, ended, exists or malformed
    ├── RequestError               the daemon refused the request envelope
    │                              (carries the gRPC `code` name and `details`)
    └── LoopError                  the loop core's own faults (execgate.client.loop.errors)

A tool call that fails is never an exception: it is an `Outcome`.
"""

from __future__ import annotations


class ExecgateClientError(Exception):
    """Root of the client's exceptions."""


class DaemonUnavailable(ExecgateClientError):
    def __init__(self, address: str, details: str = "") -> None:
        super().__init__(
            f"no execgate daemon answers at {address}; start one with `make run` "
            f"(or `execgate serve`), or point EXECGATE_ADDR / --addr at it"
            + (f" ({details})" if details else "")
        )
        self.address = address
        self.details = details


class CallNotFound(ExecgateClientError):
    def __init__(self, run_id: str, call_id: str) -> None:
        super().__init__(f"no call {call_id!r} in run {run_id or 'default'!r}")
        self.run_id = run_id
        self.call_id = call_id


class RequestError(ExecgateClientError):
    """The daemon refused the request itself (not one call of it).

    `error_class` and `field` say why and where for a malformed request (the daemon's
    `execgate-error-class` / `execgate-field` trailing metadata): `out_of_range` and
    `calls[0].timeout`, say; "" when the daemon did not say."""

    def __init__(self, code: str, details: str, error_class: str = "", field: str = "") -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
        self.error_class = error_class
        self.field = field


class Unauthenticated(ExecgateClientError):
    def __init__(self, address: str, details: str = "") -> None:
        super().__init__(f"the daemon at {address} does not know who we are: {details}")
        self.address = address
        self.details = details


class PermissionDenied(ExecgateClientError):
    def __init__(self, address: str, details: str = "") -> None:
        super().__init__(f"the daemon at {address} refused: {details}")
        self.address = address
        self.details = details


class ApprovalNotPending(ExecgateClientError):
    def __init__(self, approval_id: str, details: str = "") -> None:
        super().__init__(f"approval {approval_id!r} cannot be decided: {details}")
        self.approval_id = approval_id
        self.details = details


class RunNotFound(ExecgateClientError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r}")
        self.run_id = run_id


class RunRefused(ExecgateClientError):
    """`kind`: the daemon's refusal class (the text before the first colon)."""

    def __init__(self, run_id: str, details: str) -> None:
        super().__init__(f"run {run_id!r}: {details}")
        self.run_id = run_id
        self.kind = details.split(":", 1)[0].strip()
        self.details = details
