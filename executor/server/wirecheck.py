"""Checks of a request's fields at the edge, before any value reaches the daemon's types.

Each raises `MalformedRequest` naming its class and the field's path, which the
request guard (`requests.py`) answers with INVALID_ARGUMENT:

    out_of_range     a Timestamp before 1970 or after 9999-12-31, nanos outside
                     [0, 1e9); a Duration negative or beyond +-10,000 years, nanos out
                     of range or of the other sign; a number NaN, infinite or negative
    unknown_enum     an enum value (or a closed set of strings) the daemon does not know
    too_deep         JSON nested deeper than MAX_JSON_DEPTH
    bad_page_token   a page token the daemon did not issue for this query (`PageTokens`)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import secrets
import struct
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from execgate.executor.core.errors import MalformedRequest

# 9999-12-31T23:59:59Z, the last second a Timestamp may hold (google/protobuf/timestamp.proto).
MAX_TIMESTAMP_SECONDS = 253_402_300_799
# +-10,000 years (google/protobuf/duration.proto).
MAX_DURATION_SECONDS = 315_576_000_000
NANOS = 1_000_000_000

E = TypeVar("E")


def timestamp(ts: Timestamp, field: str) -> float:
    """Epoch seconds of a Timestamp inside [1970, 9999]."""
    if not 0 <= ts.seconds <= MAX_TIMESTAMP_SECONDS or not 0 <= ts.nanos < NANOS:
        raise MalformedRequest(
            "out_of_range",
            field,
            f"{field}: seconds={ts.seconds} nanos={ts.nanos} is not a time between "
            "1970-01-01 and 9999-12-31 (nanos in [0, 1e9))",
        )
    return ts.seconds + ts.nanos / NANOS


def duration(d: Duration, field: str) -> float:
    """Seconds of a non-negative Duration within protobuf's range."""
    # Negative durations (both parts <= 0 in protobuf) mean nothing for a timeout or grace.
    if not (0 <= d.seconds <= MAX_DURATION_SECONDS and 0 <= d.nanos < NANOS):
        raise MalformedRequest(
            "out_of_range",
            field,
            f"{field}: seconds={d.seconds} nanos={d.nanos} is not a duration of 0 to "
            f"{MAX_DURATION_SECONDS} seconds (nanos in [0, 1e9), never negative)",
        )
    return d.seconds + d.nanos / NANOS


def non_negative(value: float, field: str) -> float:
    """A finite number >= 0 (0 usually means: not set)."""
    if not math.isfinite(value) or value < 0:
        raise MalformedRequest(
            "out_of_range", field, f"{field}: {value!r} is not a finite number >= 0"
        )
    return value


def enum_values(values: Iterable[Any], known: Mapping[Any, E], field: str) -> tuple[E, ...]:
    """Each of `values` mapped through `known`; an unknown value names its index."""
    out = []
    for i, value in enumerate(values):
        if value not in known:
            raise MalformedRequest(
                "unknown_enum",
                f"{field}[{i}]",
                f"{field}[{i}]: {value} is not a value this daemon knows "
                f"(known: {', '.join(str(k) for k in sorted(known))})",
            )
        out.append(known[value])
    return tuple(out)


def known_strings(values: Iterable[str], known: frozenset[str], field: str) -> list[str]:
    out = list(values)
    for i, value in enumerate(out):
        if value not in known:
            raise MalformedRequest(
                "unknown_enum",
                f"{field}[{i}]",
                f"{field}[{i}]: {value[:100]!r} is not one of {', '.join(sorted(known))}",
            )
    return out


class PageTokens:
    """Opaque page tokens: a cursor the daemon issued for one query, and no other.

    A token is base64url(cursor, 8 bytes big-endian || HMAC-SHA256(key, cursor ||
    sha256(query))[:16]); the key is random per daemon process, so a token does not
    survive a restart (the listing starts again). `query` binds a token to the
    filter and caller it was issued for."""

    TOKEN_CHARS = 32  # 24 bytes in base64url, unpadded

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def issue(self, cursor: int, query: bytes) -> str:
        raw = struct.pack(">Q", cursor)
        return base64.urlsafe_b64encode(raw + self._mac(raw, query)).decode().rstrip("=")

    def open(self, token: str, query: bytes, field: str = "page_token") -> int:
        """The cursor of a token this daemon issued for `query`."""
        raw = b""
        if len(token) == self.TOKEN_CHARS:
            try:
                raw = base64.urlsafe_b64decode(token + "==")
            except (ValueError, TypeError):
                raw = b""
        if len(raw) != 24 or not hmac.compare_digest(raw[8:], self._mac(raw[:8], query)):
            raise MalformedRequest(
                "bad_page_token",
                field,
                f"{field}: not a token this daemon issued for this query (tokens are "
                "opaque, bound to the query's filter, and lapse when the daemon restarts)",
            )
        cursor: int = struct.unpack(">Q", raw[:8])[0]
        return cursor

    def _mac(self, cursor: bytes, query: bytes) -> bytes:
        digest = hashlib.sha256(query).digest()
        return hmac.new(self._key, cursor + digest, hashlib.sha256).digest()[:16]
