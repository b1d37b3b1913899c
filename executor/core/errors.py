"""Exceptions of the daemon: one tree, rooted here, for every class `execgate.executor` raises.

Each room may define its own classes in its own modules; every one of them is drawn here,
under the base it derives from, with the module that defines it (a test walks the package
and holds this drawing to the code: tests/unit/test_error_trees.py).

    ExecgateError                   core.errors         root
    ├── ToolError                   core.errors         an expected, typed failure of one call
    │                                                   (Status, ErrorClass, message, field)
    ├── ConfigError                 core.errors         bad daemon configuration (flags, paths)
    │   ├── SettingError            core.ranges         a number outside its range (setting,
    │   │                                               value, allowed)
    │   └── JournalTooNew           journal.schema      a journal of a newer daemon (found,
    │                                                   latest schema versions)
    ├── LocatedError                core.errors         a file that cannot be used (path, line,
    │   │                                               column)
    │   ├── PolicyError             core.errors         a policy file that cannot be loaded
    │   │   └── PolicyErrors        core.errors         every error of one file (`.errors`)
    │   ├── IdentityError           core.errors         an identities file that cannot be
    │   │                                               loaded (also a ConfigError)
    │   └── ToolFileError           core.errors         a tools file that cannot be loaded
    │       └── ToolFileErrors      core.errors         every error of the file(s) (`.errors`)
    ├── MalformedRequest            core.errors         an RPC's request the daemon cannot use
    │                                                   (kind, field, message)
    ├── Detached                    core.approval       the daemon stops while a call awaits
    │                                                   approval (approval)
    ├── Lagging                     core.fanout         a watcher fell behind (backlog, resume)
    ├── Closed                      core.fanout         the fan-out closed under a watcher (why)
    ├── _TooBig                     core.regexbound     a regex past the bound, mid-estimate
    ├── BrokenHistory               core.runstate       a run's recorded transitions do not fit
    │                                                   the table (run_id, seq, kind)
    ├── DuplicateCall               journal.records     (run_id, call_id) already journaled
    ├── KeyTaken                    journal.records     an idempotency key another call holds
    │                                                   (agent, key)
    ├── PgUnavailable               journal.pg.db       the PostgreSQL journal unreachable
    │                                                   (waited, why)
    ├── LeaseLost                   journal.pg.presence  this daemon's lease is gone
    │                                                   (daemon_id)
    ├── LockError                   locks.base          root of the lock room
    │   ├── Abandoned               locks.base          a waiter gave up (owner)
    │   └── BackendClosed           locks.base          the lock backend was closed
    ├── Undecided                   policy.model        a `matches` regex ran out of time (arg)
    ├── RunRefused                  runs.registry       a run change refused (kind, message,
    │                                                   field)
    ├── Closing                     runs.registry       the daemon stops under a WatchRun
    │                                                   (run_id)
    ├── SandboxError                sandbox.base        the sandbox could not start the call
    │   │                                               (message)
    │   ├── ProgramNotFound         sandbox.process     (program)
    │   ├── ProgramNotExecutable    sandbox.process     (program)
    │   ├── HostGone                sandbox.warm_call   a warm host ended before the call
    │   ├── SpawnFailed             sandbox.warm_call   a warm call's exec failed (E2BIG...)
    │   └── ContainerGone           sandbox.dockerd     dockerd forgot the container
    │                                                   (explanation)
    ├── WriteAbandoned              tools.fileio        a write stopped before its rename (path)
    ├── _Unsupported                tools.schemacheck   a schema with no fast path, mid-compile
    ├── _Cancelled                  tools.search        a search's cancel, inside its thread
    ├── NoStatements                tools.sqlanalysis   SQL text without a statement (also a
    │                                                   ValueError)
    ├── Interrupted                 tools.sqlexec       SQLite work aborted by cancel or timeout
    ├── CommitUncertain             tools.sqlexec       no proof nothing was committed (message;
    │                                                   also a RuntimeError)
    ├── TemplateSyntaxError         tools.template      a tools file's template that does not
    │                                                   parse (also a ValueError)
    ├── StartFailed                 tools.mcp.connection  an MCP server did not come up (why)
    ├── ListingTooLong              tools.mcp.connection  a server's tools/list past the bounds
    ├── OutputMismatch              tools.mcp.outputs   a result that does not fit its
    │                                                   outputSchema
    ├── ServerDown                  tools.mcp.server    an MCP server cannot be started now
    │                                                   (name, why; backoff)
    ├── LineTooLong                 tools.mcp.transport  an MCP message over the bound (limit)
    ├── TooManyRequests             tools.mcp.transport  a server's unanswered requests past
    │                                                   the bound (limit)
    ├── ApprovalError               pipeline.approve    a Decide that cannot be done (refused,
    │                                                   message)
    ├── NotYours                    pipeline.inflight   a cancel of another's calls (agent,
    │                                                   message)
    ├── _Corrupt                    server.guard        the wire format breaks (request guard)
    ├── RpcError                    server.status       an RPC the server ends itself (message)
    │   ├── AccessRefused           server.status       the caller may not make this RPC
    │   │   ├── Unauthenticated     server.status       no, a wrong or a revoked credential
    │   │   └── PermissionDenied    server.status       a known caller without the rights
    │   ├── CallNotFound            server.status       GetCall of a call not there for it
    │   │                                               (run_id, call_id)
    │   ├── BadArgument             server.status       a field a servicer cannot use (field)
    │   ├── OutcomesUnrecorded      server.status       outcomes the journal lost (call_ids)
    │   └── OutcomesDetached        server.status       calls parked across a restart (parked)
    └── AmbiguousPrefix             cli.lookup          an id prefix of several ids (kind,
                                                        prefix, matches; also the client's
                                                        ExecgateClientError, as the CLI
                                                        reports it)

A `ToolError` raised by validation or a tool becomes that call's Outcome; it never
reaches gRPC. Anything else escaping a tool becomes FAILURE/internal (read-only
tools) or UNKNOWN_OUTCOME/internal (writing tools) -- see `dispatch`.

The errors that end an RPC are mapped to gRPC statuses in one place, at the edge:
`execgate.executor.server.status` (`RULES`, `abort_for`). A `MalformedRequest` raised
anywhere below the servicers is answered INVALID_ARGUMENT, with the class and field in the
trailing metadata (`execgate-error-class`, `execgate-field`) and in the details
("CLASS: FIELD: message"), logged as one line by the request guard (`server.guard`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .outcomes import ErrorClass, Status


class ExecgateError(Exception):
    """Root of every exception this package raises on purpose."""


class ToolError(ExecgateError):
    def __init__(
        self,
        error_class: ErrorClass,
        message: str,
        *,
        field: str = "",
        status: Status = Status.FAILURE,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.field = field
        self.status = status


def invalid(message: str, field: str) -> ToolError:
    """A REJECTED invalid_argument error naming the offending field."""
    return ToolError(ErrorClass.INVALID_ARGUMENT, message, field=field, status=Status.REJECTED)


class ConfigError(ExecgateError):
    pass


class MalformedRequest(ExecgateError):
    """A request envelope the daemon cannot use: undecodable bytes, invalid UTF-8, a time
    out of range, a page token it did not issue, an unknown enum value, JSON nested too
    deeply, a field missing or too large. `kind` is the class (`undecodable`,
    `invalid_utf8`, `out_of_range`, `bad_page_token`, `unknown_enum`, `too_deep`,
    `too_large`, `missing`), `field` the offending field's path (`calls[0].timeout`;
    "" for the message as a whole)."""

    def __init__(self, kind: str, field: str, message: str) -> None:
        named = not field or message.startswith(f"{field}:")
        super().__init__(f"{kind}: {message}" if named else f"{kind}: {field}: {message}")
        self.kind = kind
        self.field = field
        self.message = message


class LocatedError(ExecgateError):
    """A file that cannot be used; says file:line:column and the field."""

    def __init__(self, message: str, *, path: str = "", line: int = 0, column: int = 0) -> None:
        where = path
        if line:
            where += f":{line}" + (f":{column}" if column else "")
        super().__init__(f"{where}: {message}" if where else message)
        self.path = path
        self.line = line
        self.column = column


class PolicyError(LocatedError):
    """A policy file that cannot be used."""


class PolicyErrors(PolicyError):
    """Every error of one policy file, in file order; located where the first one is."""

    def __init__(self, errors: Sequence[LocatedError]) -> None:
        first = errors[0]
        Exception.__init__(self, "\n".join(str(e) for e in errors))
        self.path, self.line, self.column = first.path, first.line, first.column
        self.errors: tuple[LocatedError, ...] = tuple(errors)


class IdentityError(LocatedError, ConfigError):
    """An identities file that cannot be used."""


class ToolFileError(LocatedError):
    """A tools file (or a file of a tools.d/ directory) that cannot be used."""


class ToolFileErrors(ToolFileError):
    """Every error of the tools file(s), in file order; located where the first one is."""

    def __init__(self, errors: Sequence[LocatedError]) -> None:
        first = errors[0]
        Exception.__init__(self, "\n".join(str(e) for e in errors))
        self.path, self.line, self.column = first.path, first.line, first.column
        self.errors: tuple[LocatedError, ...] = tuple(errors)
