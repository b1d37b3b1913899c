"""Exceptions of the daemon.

    ExecgateError                 root; never crosses the gRPC edge
    ├── ToolError                 an expected, typed failure of one call
    │   (carries the Status, ErrorClass, message and offending field)
    ├── ConfigError               bad daemon configuration (CLI flags, paths)
    │   └── IdentityError         an identities file that cannot be loaded (file:line:column)
    ├── PolicyError               a policy file that cannot be loaded
    │   └── PolicyErrors          every error of one file (`.errors`), read as the first
    └── MalformedRequest          an RPC's request the daemon cannot use at all
        (carries the class and the offending field; answered INVALID_ARGUMENT)

A `ToolError` raised by validation or a tool becomes that call's Outcome; it never
reaches gRPC. Anything else escaping a tool becomes FAILURE/internal (read-only
tools) or UNKNOWN_OUTCOME/internal (writing tools) -- see `dispatch`.

A `MalformedRequest` is the one exception meant to cross the edge: the request guard
(`requests.py`) answers it with INVALID_ARGUMENT, the class and field in the trailing
metadata (`execgate-error-class`, `execgate-field`) and in the details
("CLASS: FIELD: message"), logged as one line.
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
