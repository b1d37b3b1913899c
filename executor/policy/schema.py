"""The policy file checked against its JSON Schema (policies/policy.schema.json).

The schema is the one description of the format: editors validate with it (the
shipped files name it on their first line), and the loader runs it first, on the
document built from the YAML nodes, so each error is mapped back to the node it is
about and reported at file:line:column, every error of the file, in file order.
What a schema cannot say (a key twice, an id reused, a regex that does not
compile, a rule's examples) is left to the loader (`load`).

The words of an error are the schema's own where it has them: a subschema's
`x-messages` is a string (for any failing keyword) or a mapping from keyword to
message; otherwise a short message is made from the keyword.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any

import jsonschema
import yaml
from jsonschema.exceptions import ValidationError

from execgate.executor.core.errors import LocatedError, PolicyError, PolicyErrors
from execgate.executor.core.yamldoc import YamlDoc

__all__ = ["duplicate_keys", "raise_all", "schema", "schema_errors"]

_TYPES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "true or false",
}


@functools.cache
def schema() -> dict[str, Any]:
    """The shipped policy schema (policies/policy.schema.json)."""
    text = resources.files("execgate.policies").joinpath("policy.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def schema_errors(doc: YamlDoc, root: yaml.Node) -> list[LocatedError]:
    """Every way the document at `root` breaks the schema, in file order."""
    try:
        value = doc.value(root)
    except yaml.YAMLError as exc:  # a tag SafeLoader cannot build, say
        mark = getattr(exc, "problem_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        return [PolicyError(f"not valid YAML: {exc}", path=doc.source, line=line, column=column)]
    found: list[LocatedError] = []
    for err in _validator().iter_errors(value):
        found.extend(_located(doc, root, err))
    return sorted(found, key=lambda e: (e.line, e.column))


def duplicate_keys(doc: YamlDoc, node: yaml.Node, where: str = "file") -> list[LocatedError]:
    """A key given twice in any mapping (the document keeps only the last)."""
    found: list[LocatedError] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[object] = set()
        for key_node, value_node in node.value:
            key = doc.value(key_node)
            if _hashable(key) and key in seen:
                found.append(doc.error(key_node, f"{where}: {key!r} appears twice"))
            seen.add(key if _hashable(key) else id(key_node))
            found.extend(duplicate_keys(doc, value_node, _join(where, key)))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found.extend(duplicate_keys(doc, item, _join(where, i)))
    return found


def _located(doc: YamlDoc, root: yaml.Node, err: ValidationError) -> Iterator[LocatedError]:
    path = list(err.absolute_path)
    node = _node_at(doc, root, path)
    where = _where(path)
    if err.validator == "additionalProperties" and isinstance(node, yaml.MappingNode):
        known = sorted(_subschema(err).get("properties", {}))
        for key_node, _ in node.value:
            key = doc.value(key_node)
            if key not in known:
                yield doc.error(
                    key_node, f"{where}: unknown key {key!r} (known: {', '.join(known)})"
                )
        return
    if err.validator == "required" and isinstance(err.instance, dict):
        required: Any = err.validator_value
        for name in (n for n in required if n not in err.instance):
            yield doc.error(node, f"{_join(where, name)}: {_message(err, 'required')}")
        return
    yield doc.error(node, f"{where}: {_message(err, _default_message(err))}")


def _message(err: ValidationError, default: str) -> str:
    """The subschema's `x-messages` for the failing keyword, `{key}` filled in."""
    custom = _subschema(err).get("x-messages")
    if isinstance(custom, dict):
        custom = custom.get(str(err.validator))
    if not isinstance(custom, str):
        return default
    key = err.absolute_path[-1] if err.absolute_path else "file"
    return custom.replace("{key}", str(key))


def _subschema(err: ValidationError) -> dict[str, Any]:
    return dict(err.schema) if isinstance(err.schema, dict) else {}


def _default_message(err: ValidationError) -> str:
    rule, value = str(err.validator), err.validator_value
    if rule == "type":
        kinds: list[str] = value if isinstance(value, list) else [str(value)]
        return "must be " + " or ".join(_TYPES.get(k, k) for k in kinds)
    if rule == "enum":
        names: list[Any] = value if isinstance(value, list) else [value]
        return f"must be {' or '.join(map(str, names))}, not {err.instance!r}"
    if rule == "const":
        return f"must be {value!r}"
    if rule in ("minItems", "minLength"):
        return "must not be empty"
    if rule in ("exclusiveMinimum", "minimum"):
        return f"must be more than {value}" if rule == "exclusiveMinimum" else f"at least {value}"
    return err.message


def _node_at(doc: YamlDoc, node: yaml.Node, path: list[Any]) -> yaml.Node:
    """The node `path` leads to (the last mapping entry of a key given twice wins, as
    in the document); as far as it leads, should the document differ from the nodes."""
    for step in path:
        if isinstance(node, yaml.MappingNode):
            hits = [v for k, v in node.value if doc.value(k) == step]
            if not hits:
                return node
            node = hits[-1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int):
            if step >= len(node.value):
                return node
            node = node.value[step]
        else:
            return node
    return node


def _where(path: list[Any]) -> str:
    where = "file"
    for step in path:
        where = _join(where, step)
    return where


def _join(where: str, step: object) -> str:
    if isinstance(step, int):
        return f"{where}[{step}]"
    return str(step) if where == "file" else f"{where}.{step}"


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def raise_all(errors: Sequence[LocatedError]) -> None:
    """Raise the errors found (a PolicyErrors naming them all); nothing if none."""
    if errors:
        raise PolicyErrors(errors)
