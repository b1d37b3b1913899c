"""schemabound: a tool's input schema neither fetches nor backtracks without bound."""

from __future__ import annotations

import time
from typing import Any

import pytest

from execgate.executor.tools import schemabound
from execgate.executor.tools.schemabound import has_patterns, outside_ref, pattern_problem
from execgate.executor.tools.toolset import BoundedValidator, SchemaValidator

BACKTRACKS = {"type": "object", "properties": {"text": {"type": "string", "pattern": "^(a|aa)*$"}}}


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def test_references_inside_the_schema_are_fine_and_others_are_named() -> None:
    inside = {**_object(p={"$ref": "#/$defs/s"}), "$defs": {"s": {"type": "string"}}}
    assert outside_ref(inside) is None
    assert outside_ref(_object(p={"items": [{"$ref": "http://x/s"}]})) == "http://x/s"
    assert outside_ref(_object(p={"$dynamicRef": "other.json#meta"})) == "other.json#meta"
    # A property named $ref, and a $ref inside a default, are data.
    assert outside_ref(_object(**{"$ref": {"type": "string", "default": {"$ref": "u"}}})) is None


def test_patterns_are_found_where_they_are_schemas_only() -> None:
    assert has_patterns(_object(p={"anyOf": [{"pattern": "^a"}]}))
    # An argument named `pattern` (the search tool has one) is no pattern.
    named = _object(pattern={"type": "string"}, q={"const": {"pattern": "(("}})
    assert not has_patterns(named)
    assert pattern_problem(named) is None


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"patternProperties": {"^a": {}}}, "patternProperties is not supported"),
        (_object(p={"pattern": "(("}), "it does not compile"),
        (_object(p={"pattern": "((a{1000}){1000}){1000}"}), "would compile to"),
        (_object(p={"pattern": "a" * 5000}), "5000 characters"),
    ],
)
def test_a_pattern_that_cannot_be_bounded_is_named(schema: dict[str, Any], why: str) -> None:
    found = pattern_problem(schema)
    assert found is not None
    assert why in found, found


def test_a_backtracking_match_stops_at_the_budget() -> None:
    validator = BoundedValidator(BACKTRACKS)
    began = time.monotonic()
    with schemabound.budget(100):
        errors = list(validator.iter_errors({"text": "a" * 60 + "b"}))
    assert time.monotonic() - began < 5  # unbounded: centuries
    assert [e.message.startswith("matching it against") for e in errors] == [True], errors
    assert "took too long" in errors[0].message


def test_a_quick_match_is_judged_as_jsonschema_would() -> None:
    for text, valid in (("aaaa", True), ("aab", False), ("", True)):
        assert BoundedValidator(BACKTRACKS).is_valid({"text": text}) is valid
        assert SchemaValidator(BACKTRACKS).is_valid({"text": text}) is valid


def test_a_spent_budget_fails_every_later_match() -> None:
    # `properties` are matched in their order: b spends the budget, then a cannot run.
    schema = _object(b={"pattern": "^(a|aa)*$"}, a={"pattern": "^a+$"})
    with schemabound.budget(0):
        errors = list(BoundedValidator(schema).iter_errors({"a": "aaa", "b": "a" * 60 + "b"}))
    assert [e.path[0] for e in errors] == ["b", "a"], errors
    assert all("took too long" in e.message for e in errors), errors
