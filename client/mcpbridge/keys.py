"""Which execgate call a `tools/call` becomes: its call id and its idempotency key.

MCP request ids start again at 0 in every session, and a client that retries sends a new
request (a new id), so the request id alone names nothing durable. What each key covers:

- The call id is `mcp-<session>-<request id>`: unique in the session's run, and what a
  `notifications/cancelled` (which names the request id) is turned back into, to Cancel it.
- The idempotency key is the client's `_meta["execgate/idempotencyKey"]` when it sends one:
  the daemon answers a later call with the same key and the same tool and arguments, from
  this session or any other of the same identity, with the recorded outcome (or joins the
  call still running) instead of running it again; the same key with other arguments is
  REJECTED (idempotency_conflict).
- Without one, over streamable HTTP, the key is the call id itself. That deduplicates
  only the same request delivered twice in one session (an HTTP client re-posting a
  message whose answer it lost). Over stdio there is none: a pipe delivers a message
  once, and a key costs the daemon a journal lookup per call. Either way a retry with a
  new request id is a new call: only the client's key makes a retry safe.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from .errors import BadMeta

__all__ = ["IDEMPOTENCY_META", "call_id", "idempotency_key"]

# The `_meta` key of a tools/call that carries the client's idempotency key. A
# vendor prefix (`execgate/`), as MCP asks of non-protocol `_meta` keys.
IDEMPOTENCY_META = "execgate/idempotencyKey"
# The daemon's bound on ids (core/requests.py MAX_ID_CHARS).
MAX_KEY_CHARS = 256
# A request id put into a call id as it is; any other is hashed (bounded, printable).
_PLAIN = re.compile(r"[A-Za-z0-9._-]{1,64}")


def call_id(session: str, request_id: str | int) -> str:
    """The call id of request `request_id` of `session`. A string id is marked apart
    from a number (`"1"` and `1` are different JSON-RPC ids)."""
    if isinstance(request_id, int):
        return f"mcp-{session}-{request_id}"
    if _PLAIN.fullmatch(request_id):
        return f"mcp-{session}-s{request_id}"
    digest = hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"mcp-{session}-h{digest}"


def idempotency_key(meta: Mapping[str, Any] | None, otherwise: str) -> str:
    """The client's key from `_meta`, else `otherwise` ("": none). BadMeta: a key that is
    not a non-empty string of at most MAX_KEY_CHARS characters."""
    if meta is None or IDEMPOTENCY_META not in meta:
        return otherwise
    key = meta[IDEMPOTENCY_META]
    if not isinstance(key, str) or not key:
        raise BadMeta(IDEMPOTENCY_META, f"must be a non-empty string, not {key!r:.40}")
    if len(key) > MAX_KEY_CHARS:
        raise BadMeta(IDEMPOTENCY_META, f"longer than {MAX_KEY_CHARS} characters")
    return key
