"""A fast path for the JSON Schemas tools' arguments commonly have, compiled once per tool.

The full validator (toolset.SchemaValidator: jsonschema, Draft 2020-12, an "integer"
never a bool) walks its keyword table for every call: 30-120 us for the built-in
tools' schemas, on the event loop, for every call. `compile_schema` turns a schema
written in a common subset of keywords into a predicate made of plain checks, once,
when the tool set is built:

- the predicate answers True only for instances the full validator accepts (each
  keyword below is checked exactly as jsonschema checks it, or more strictly);
- False is no verdict: validation then asks the full validator, which also names the
  offending field of an invalid call;
- a schema with any keyword outside the subset gets no predicate (None): every call
  goes to the full validator, as before.

The subset: type, properties, required, additionalProperties, propertyNames, items
(without prefixItems), minItems, maxItems, minLength, maxLength, pattern, enum (of
strings), minimum, maximum, exclusiveMinimum, exclusiveMaximum, and annotations
(title, description, default, examples, $comment, deprecated, readOnly, writeOnly,
format: the full validator has no format checker, so format asserts nothing).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Mapping, Sized
from typing import Any

from execgate.executor.core.errors import ExecgateError

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",
    }
)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Number) and not isinstance(v, bool)


_TYPES: Mapping[str, Check] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


class _Unsupported(ExecgateError):
    """The schema uses something outside the subset: no fast path."""


def compile_schema(schema: Any) -> Check | None:
    """The schema's predicate (module docstring), or None if it has no fast path."""
    try:
        return _compile(schema)
    except (_Unsupported, re.error, TypeError, ValueError):
        return None


def _always(_v: Any) -> bool:
    return True


def _compile(schema: Any) -> Check:
    if schema is True:
        return _always
    if not isinstance(schema, dict):
        raise _Unsupported  # False, or not a schema at all
    checks: list[Check] = []
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        make = _KEYWORDS.get(key)
        if make is None:
            raise _Unsupported
        checks.append(make(value, schema))
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    every = tuple(checks)
    return lambda v: all(check(v) for check in every)


def _type(value: Any, _schema: dict[str, Any]) -> Check:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or any(n not in _TYPES for n in names):
        raise _Unsupported
    tests = tuple(_TYPES[n] for n in names)
    if len(tests) == 1:
        return tests[0]
    return lambda v: any(test(v) for test in tests)


def _properties(value: Any, _schema: dict[str, Any]) -> Check:
    if not isinstance(value, dict):
        raise _Unsupported
    subs = tuple((name, _compile(sub)) for name, sub in value.items())

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        return all(sub(v[name]) for name, sub in subs if name in v)

    return check


def _required(value: Any, _schema: dict[str, Any]) -> Check:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise _Unsupported
    names = tuple(value)
    return lambda v: not isinstance(v, dict) or all(n in v for n in names)


def _additional(value: Any, schema: dict[str, Any]) -> Check:
    known = frozenset(schema.get("properties", {}))
    if value is True:
        return _always
    extra = _compile(value) if value is not False else None

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        others = [k for k in v if k not in known]
        if extra is None:
            return not others
        return all(extra(v[k]) for k in others)

    return check


def _property_names(value: Any, _schema: dict[str, Any]) -> Check:
    sub = _compile(value)
    return lambda v: not isinstance(v, dict) or all(sub(k) for k in v)


def _items(value: Any, _schema: dict[str, Any]) -> Check:
    if value is False:
        return lambda v: not isinstance(v, list) or not v
    sub = _compile(value)
    return lambda v: not isinstance(v, list) or all(sub(item) for item in v)


def _count(kind: type[Sized], at_least: bool) -> Callable[[Any, dict[str, Any]], Check]:
    def make(value: Any, _schema: dict[str, Any]) -> Check:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Unsupported
        if at_least:
            return lambda v: not isinstance(v, kind) or len(v) >= value
        return lambda v: not isinstance(v, kind) or len(v) <= value

    return make


def _pattern(value: Any, _schema: dict[str, Any]) -> Check:
    if not isinstance(value, str):
        raise _Unsupported
    compiled = re.compile(value)  # the full validator: re.search(pattern, instance)
    return lambda v: not isinstance(v, str) or compiled.search(v) is not None


def _enum(value: Any, _schema: dict[str, Any]) -> Check:
    if not isinstance(value, list) or not all(isinstance(e, str) for e in value):
        raise _Unsupported
    allowed = frozenset(value)
    return lambda v: isinstance(v, str) and v in allowed


def _bound(compare: Callable[[Any, Any], bool]) -> Callable[[Any, dict[str, Any]], Check]:
    def make(value: Any, _schema: dict[str, Any]) -> Check:
        if not _is_number(value):
            raise _Unsupported
        return lambda v: not _is_number(v) or compare(v, value)

    return make


_KEYWORDS: Mapping[str, Callable[[Any, dict[str, Any]], Check]] = {
    "type": _type,
    "properties": _properties,
    "required": _required,
    "additionalProperties": _additional,
    "propertyNames": _property_names,
    "items": _items,
    "minItems": _count(list, at_least=True),
    "maxItems": _count(list, at_least=False),
    "minLength": _count(str, at_least=True),
    "maxLength": _count(str, at_least=False),
    "pattern": _pattern,
    "enum": _enum,
    "minimum": _bound(lambda v, b: v >= b),
    "maximum": _bound(lambda v, b: v <= b),
    "exclusiveMinimum": _bound(lambda v, b: v > b),
    "exclusiveMaximum": _bound(lambda v, b: v < b),
}
