"""What a tool's input schema may make the daemon do while it validates a call.

Every call's arguments are validated against its tool's schema on the event loop, and
an MCP server's schema is the server's, which nobody vouches for. So:

- **References stay inside the schema.** jsonschema fetches a `$ref` it cannot resolve
  locally (`http://...`) with urllib: from the daemon's own network (no sandbox), with
  no timeout, on the event loop. Validators are built with `NO_RETRIEVAL`, a registry
  that fetches nothing, and a schema that refers outside itself is refused where it
  comes in (`outside_ref`: a server's tool is left out; a tools file does not load).
- **Patterns run under a time budget, off the event loop.** jsonschema matches a
  `pattern` with `re`, which holds the GIL for as long as it backtracks: `^(a|aa)*$`
  against 38 characters took the whole daemon for half a minute, and each character
  more costs 1.6 times as long. A declared or served tool's `pattern` is matched by
  `bounded_pattern` instead: the `regex` module, releasing the GIL, stopped once the
  call's validation has spent its `budget` (PATTERN_BUDGET_SECONDS, plus
  PATTERN_SECONDS_PER_MIB for each MiB of the call's arguments: a linear match of a
  large argument still fits). The validator then runs in a worker thread, so a slow
  match holds up that call alone. Where a schema comes in, each pattern must compile
  within `regexbound`'s bound, and `patternProperties` is refused: jsonschema matches
  those patterns itself, with `re`, in several keywords (`pattern_problem`). The
  built-in tools' schemas are the daemon's own and run as they are.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import referencing
import referencing.exceptions
import regex
from jsonschema import ValidationError

from execgate.executor.core.regexbound import check_pattern

__all__ = [
    "NO_RETRIEVAL",
    "bounded_pattern",
    "budget",
    "has_patterns",
    "outside_ref",
    "pattern_problem",
]

# What one call's validation may spend matching patterns: this, plus the second part
# per MiB of its arguments.
PATTERN_BUDGET_SECONDS = 0.25
PATTERN_SECONDS_PER_MIB = 1.0
# The longest pattern a schema may hold (as the search tool's).
MAX_PATTERN_CHARS = 4096
# time.monotonic() by which the validation running in this context must be done.
_DEADLINE: ContextVar[float | None] = ContextVar("execgate_pattern_deadline", default=None)

# Keywords whose values are data, not schemas: a `$ref` key in them refers to nothing.
_DATA_KEYWORDS = frozenset({"const", "default", "enum", "examples", "dependentRequired"})
# Keywords whose values map names to subschemas.
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_REF_KEYWORDS = ("$ref", "$dynamicRef")


def _retrieve_nothing(uri: str) -> referencing.Resource[Any]:
    # referencing's classes are attrs classes behind its own decorator: mypy cannot see
    # their __init__.
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


# A registry that resolves references inside the schema only.
NO_RETRIEVAL: referencing.Registry[Any] = referencing.Registry(retrieve=_retrieve_nothing)  # type: ignore[call-arg]


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
    """Every schema object in the schema (iteratively: a server chooses the depth). The
    maps of named subschemas (`properties`, ...) are walked through, not taken for
    schemas (a property may be named `pattern`); data keywords' values are skipped."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            yield node
            for key, value in node.items():
                if key in _NAMED and isinstance(value, dict):
                    stack.extend(value.values())
                elif key not in _DATA_KEYWORDS:
                    stack.append(value)


def pattern_problem(schema: Any) -> str | None:
    """Why the schema's patterns cannot be matched within a bound, or None."""
    for node in _schemas(schema):
        if isinstance(node.get("patternProperties"), dict):
            return (
                "patternProperties is not supported (jsonschema would match its patterns "
                "without a time bound)"
            )
        pattern = node.get("pattern")
        if isinstance(pattern, str) and (why := _unbounded(pattern)) is not None:
            return f"pattern {pattern[:80]!r}: {why}"
    return None


def _unbounded(pattern: str) -> str | None:
    why = check_pattern(pattern, MAX_PATTERN_CHARS)
    if why is not None:
        return why
    try:
        regex.compile(pattern)
    except (regex.error, OverflowError, RecursionError) as exc:
        return f"it does not compile: {exc}"
    return None


def has_patterns(schema: Any) -> bool:
    """Does the schema hold a `pattern` (its validation then runs in a worker thread)?"""
    return any(isinstance(n.get("pattern"), str) for n in _schemas(schema))


@contextlib.contextmanager
def budget(arguments_bytes: int) -> Iterator[None]:
    """The time the patterns of one call's validation may take, from now."""
    seconds = PATTERN_BUDGET_SECONDS + PATTERN_SECONDS_PER_MIB * arguments_bytes / (1 << 20)
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def bounded_pattern(
    validator: Any, pattern: str, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    """The `pattern` keyword, its match bounded by the validation's `budget`."""
    del schema
    if not validator.is_type(instance, "string"):
        return
    deadline = _DEADLINE.get()
    left = PATTERN_BUDGET_SECONDS if deadline is None else deadline - time.monotonic()
    try:
        if left <= 0:
            raise TimeoutError
        found = regex.search(pattern, instance, timeout=left, concurrent=True)
    except TimeoutError:
        yield ValidationError(
            f"matching it against {pattern[:80]!r} took too long (the schema's patterns "
            f"may take {PATTERN_BUDGET_SECONDS:g}s per call, plus "
            f"{PATTERN_SECONDS_PER_MIB:g}s per MiB of arguments)"
        )
        return
    if found is None:
        yield ValidationError(f"{instance[:200]!r} does not match {pattern!r}")
