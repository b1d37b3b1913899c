"""validate.parse_arguments: a call's arguments_json, parsed strictly and bounded in bytes."""

from __future__ import annotations

import pytest

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.pipeline.validate import parse_arguments


def _rejected(text: str, max_bytes: int = 1000) -> ToolError:
    with pytest.raises(ToolError) as info:
        parse_arguments(text, max_bytes)
    assert info.value.status is Status.REJECTED
    return info.value


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_parse_arguments_empty_is_empty_object(text: str) -> None:
    assert parse_arguments(text, 100) == {}


def test_parse_arguments_object() -> None:
    assert parse_arguments('{"a": [1, {"b": null}], "c": "é"}', 100) == {
        "a": [1, {"b": None}],
        "c": "é",
    }


@pytest.mark.parametrize("text", ["[]", "1", '"x"', "null", "true", "[{}]"])
def test_parse_arguments_not_an_object(text: str) -> None:
    err = _rejected(text)
    assert err.error_class is ErrorClass.INVALID_ARGUMENT
    assert err.field == "arguments_json"
    assert "object" in err.message


@pytest.mark.parametrize("text", ["{", '{"a": 1,}', "{'a': 1}", '{"a": 1} x', "nope"])
def test_parse_arguments_not_json(text: str) -> None:
    err = _rejected(text)
    assert err.error_class is ErrorClass.INVALID_ARGUMENT
    assert err.field == "arguments_json"


def test_parse_arguments_duplicate_keys_refused() -> None:
    err = _rejected('{"path": "a", "path": "b"}')
    assert err.field == "arguments_json"
    assert "duplicate key 'path'" in err.message


def test_parse_arguments_nested_duplicate_keys_refused() -> None:
    err = _rejected('{"env": {"A": "1", "A": "2"}}')
    assert "duplicate key 'A'" in err.message


@pytest.mark.parametrize("const", ["NaN", "Infinity", "-Infinity"])
def test_parse_arguments_non_json_constants_refused(const: str) -> None:
    err = _rejected(f'{{"x": {const}}}')
    assert err.error_class is ErrorClass.INVALID_ARGUMENT
    assert const.lstrip("-") in err.message


def test_parse_arguments_deep_nesting_is_rejected_not_a_crash() -> None:
    depth = 100_000
    err = _rejected('{"a": ' + "[" * depth + "]" * depth + "}", max_bytes=10 * depth)
    assert err.error_class is ErrorClass.INVALID_ARGUMENT


def test_parse_arguments_size_counts_utf8_bytes() -> None:
    text = '{"a": "' + "é" * 10 + '"}'  # 19 characters, 29 bytes
    assert len(text) == 19
    assert len(text.encode()) == 29
    assert parse_arguments(text, 29) == {"a": "é" * 10}
    err = _rejected(text, max_bytes=28)
    assert err.error_class is ErrorClass.RESOURCE_EXHAUSTED
    assert err.field == "arguments_json"
    assert "29 bytes" in err.message
    assert "28" in err.message
