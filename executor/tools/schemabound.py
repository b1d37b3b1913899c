"""What a tool's input schema may make the daemon do while it validates a call.

Every call's arguments are validated against its tool's schema on the event loop, and
an MCP server's schema is the server's, which nobody vouches for. So:

- **References stay inside the schema.** jsonschema fetches a `$ref` it cannot resolve
  locally (`http://...`) with urllib: from the daemon's own network (no sandbox), with
  no timeout, on the event loop. Validators are built with `NO_RETRIEVAL`, a registry
  that fetches nothing, and a schema that refers outside itself is refused where it
  comes in (`outside_ref`: a server's tool is left out; a tools file does not load).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import referencing
import referencing.exceptions

__all__ = ["NO_RETRIEVAL", "outside_ref"]

# Keywords whose values are data, not schemas: a `$ref` key in them refers to nothing.
_DATA_KEYWORDS = frozenset({"const", "default", "enum", "examples"})
_REF_KEYWORDS = ("$ref", "$dynamicRef")


def _retrieve_nothing(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(ref=uri)


# A registry that resolves references inside the schema only.
NO_RETRIEVAL: referencing.Registry[Any] = referencing.Registry(retrieve=_retrieve_nothing)


def outside_ref(schema: Any) -> str | None:
    """The first `$ref`/`$dynamicRef` that does not point inside the schema (`#...`),
    or None."""
    for node in _schemas(schema):
        for keyword in _REF_KEYWORDS:
            ref = node.get(keyword)
            if isinstance(ref, str) and not ref.startswith("#"):
                return ref
    return None


def _schemas(schema: Any) -> Iterator[dict[str, Any]]:
    """Every object of the schema but the data keywords' values (iteratively: a server
    chooses the depth)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            yield node
            stack.extend(v for k, v in node.items() if k not in _DATA_KEYWORDS)
