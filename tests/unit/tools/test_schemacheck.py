"""schemacheck: the compiled fast path accepts only what the full validator accepts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execgate.executor.tools import builtin_tools
from execgate.executor.tools.schemacheck import compile_schema
from execgate.executor.tools.toolset import SchemaValidator

# Every keyword of the subset, and the corners where jsonschema is subtle.
SUBSET: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "exclusiveMaximum": 10},
            "x": {"type": ["number", "null"], "maximum": 2.5, "exclusiveMinimum": -1},
            "s": {"type": "string", "minLength": 1, "maxLength": 3, "pattern": "^a"},
            "e": {"enum": ["r", "w"]},
            "l": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
            "o": {"type": "object", "additionalProperties": {"type": "string"}},
            "k": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
            "z": {"items": False},
        },
        "required": ["n"],
        "additionalProperties": False,
        "description": "annotations are ignored",
    },
    {"properties": {"a": True}, "additionalProperties": True},
    {"type": "object", "properties": {}, "format": "anything"},
]
UNSUPPORTED: list[Any] = [
    {"anyOf": [{"type": "string"}]},
    {"$ref": "#/$defs/x", "$defs": {"x": {}}},
    {"type": "object", "patternProperties": {"^a": {}}},
    {"enum": [1, True]},
    {"const": "a"},
    {"items": [{"type": "string"}]},
    {"prefixItems": [{}]},
    {"type": "tuple"},
    False,
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-20, 20)
    | st.floats(-5, 15, allow_nan=False)
    | st.sampled_from(["", "a", "ab", "abcd", "b", "r", "w", "A_1", "é"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["n", "x", "s", "e", "l", "o", "k", "z", "a", "B", "argv", "path"]),
            inner,
            max_size=5,
        )
    ),
    max_leaves=12,
)


def _schemas() -> list[dict[str, Any]]:
    tools = [t.spec.input_schema for t in builtin_tools(test_tools=True).values()]
    return [s for s in tools + SUBSET if compile_schema(s) is not None]


SCHEMAS = _schemas()


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(range(len(SCHEMAS))), json_values)
def test_the_fast_path_accepts_only_what_the_validator_accepts(which: int, value: Any) -> None:
    schema = SCHEMAS[which]
    fast = compile_schema(schema)
    assert fast is not None
    if fast(value):
        assert SchemaValidator(schema).is_valid(value), (schema, value)


def test_it_accepts_the_common_valid_calls() -> None:
    tools = {n: t.spec.input_schema for n, t in builtin_tools(test_tools=True).items()}
    calls = {
        "noop": {"echo": "hi"},
        "read_file": {"path": "a.txt", "offset": 1, "limit": 10},
        "write_file": {"path": "a.txt", "content": "x"},
        "run_command": {"argv": ["ls"], "env": {"LANG": "C"}, "writes": ["out/"]},
    }
    for name, args in calls.items():
        fast = compile_schema(tools[name])
        assert fast is not None, name
        assert fast(args), name
    subset = compile_schema(SUBSET[0])
    assert subset is not None
    assert subset({"n": 3, "x": None, "s": "ab", "e": "w", "l": [True], "o": {"q": "v"}})


def test_what_it_refuses_is_left_to_the_validator() -> None:
    fast = compile_schema(SUBSET[0])
    assert fast is not None
    for bad in ({"n": True}, {"n": 1.0}, {"n": 10}, {"s": "b"}, {"n": 1, "extra": 1}, {}):
        assert not fast(bad)
        assert not SchemaValidator(SUBSET[0]).is_valid(bad)


@pytest.mark.parametrize("schema", UNSUPPORTED)
def test_a_schema_outside_the_subset_gets_no_fast_path(schema: Any) -> None:
    assert compile_schema(schema) is None
