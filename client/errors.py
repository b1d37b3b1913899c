"""Exceptions of the client: one tree, rooted here, for every class `execgate.client` raises.

Each package may define its own classes in its own `errors` module; every one of them is
drawn here, under the base it derives from, with the module that defines it (a test walks
the package and holds this drawing to the code: tests/unit/test_error_trees.py).

    ExecgateClientError             errors          root
    ├── DaemonUnavailable           errors          nothing answers at the address (carries
    │                                               `address`, `details`)
    ├── CallNotFound                errors          GetCall for an id the journal does not
    │                                               have (`run_id`, `call_id`)
    ├── ApprovalNotPending          errors          approve/deny of an approval that does not
    │                                               exist or is no longer pending (decided or
    │                                               expired; `approval_id`, `details`)
    ├── Unauthenticated             errors          the daemon does not know who we are: no
    │                                               token, a wrong or revoked one, or an
    │                                               unknown client certificate
    ├── PermissionDenied            errors          our identity lacks the role the RPC needs
    ├── RunNotFound                 errors          a Runs call for a run the daemon does not
    │                                               have (`run_id`)
    ├── RunRefused                  errors          the daemon refused a run change: `kind`
    │                                               is gap, duplicate, discontinuous, illegal,
    │                                               ended, exists or malformed
    ├── RequestError                errors          the daemon refused the request envelope
    │                                               (the gRPC `code` name and `details`)
    ├── LoopError                   loop.errors     the loop core's own faults
    │   ├── IllegalTransition       loop.errors     a move the transition table forbids
    │   │                                           (`from_state`, `to_state`)
    │   └── BrokenHistory           loop.errors     recorded transitions that cannot be one
    │                                               run's history (`run_id`, `seq`, `kind`)
    ├── BridgeError                 mcpbridge.errors  the MCP bridge's faults (`execgate mcp`)
    │   ├── NotLoopback             mcpbridge.errors  an HTTP listen address that is not
    │   │                                             loopback (`host`)
    │   ├── BadMeta                 mcpbridge.errors  a tools/call `_meta` execgate key of
    │   │                                             the wrong shape (`key`, `why`)
    │   └── StreamEnded             mcpbridge.errors  the Execute stream ended without the
    │                                                 call's outcome
    └── ModelError                  models.errors   a model adapter's failure (`model`)
        ├── ModelUnavailable        models.errors   nothing answered usefully; retry later
        ├── ModelRateLimited        models.errors   429 (`retry_after`)
        ├── ModelRequestRejected    models.errors   any other 4xx (`status`, `error_type`)
        ├── ModelBadResponse        models.errors   a 2xx whose body we cannot use (`what`)
        └── ScriptExhausted         models.errors   a ScriptedModel ran out of turns (`turns`)

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
