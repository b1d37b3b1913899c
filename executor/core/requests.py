"""What every room knows of a call request: its fields, its run, and the bounds on its ids.

`CallRequest` is the call exactly as the client proposed it, after the server's wire
module decoded it; the pipeline validates it into a `ValidCall`. The bounds here are
checked at the edge (server/wirecheck.py) and again wherever an id enters a record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_WORKSPACE",
    "MAX_ID_CHARS",
    "MAX_JSON_DEPTH",
    "SHARED_RUN",
    "CallRequest",
    "nested_deeper",
]

# The longest call, batch, run or idempotency id a request may carry.
MAX_ID_CHARS = 256
# The deepest JSON nesting an argument document may have.
MAX_JSON_DEPTH = 64
# The run calls without a run id belong to.
SHARED_RUN = "default"
# The workspace that is the daemon's `--workspace`: every agent's only one unless the
# policy's `workspaces:` says otherwise.
DEFAULT_WORKSPACE = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRequest:
    """One call exactly as the client proposed it (after wire decoding)."""

    run_id: str
    call_id: str
    batch_id: str
    index: int
    tool: str
    arguments_json: str
    idempotency_key: str = ""
    # Seconds; None when the client did not ask for a timeout.
    timeout: float | None = None
    # The workspace the call works in: as the client named it ("": none), then, once
    # the pipeline chose it (pipeline/workspaces.py), that workspace's name.
    workspace: str = ""


def nested_deeper(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Is this parsed JSON value nested more than `limit` containers deep?

    Iterative, so a value just under the interpreter's recursion limit costs no stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False
