"""A YAML file read as nodes, so every error can say file:line:column and the field.

Used by the policy and identities loaders: unknown keys, duplicate keys and wrong
types are errors, never ignored.
"""

from __future__ import annotations

from typing import Any

import yaml

from .errors import LocatedError


class YamlDoc:
    def __init__(self, text: str, source: str, error: type[LocatedError]) -> None:
        self.source = source
        self._error = error
        try:
            self.loader = yaml.SafeLoader(text)
        except yaml.YAMLError as exc:  # a control character: the reader refuses at once
            raise self._located(exc) from exc

    def root(self) -> yaml.Node | None:
        """The document's node; the error class's error (with line) for invalid YAML."""
        try:
            node: yaml.Node | None = self.loader.get_single_node()
        except yaml.YAMLError as exc:
            raise self._located(exc) from exc
        return node

    def _located(self, exc: yaml.YAMLError) -> LocatedError:
        mark = getattr(exc, "problem_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        what = " ".join(str(exc).split())  # one line: a log line or a CLI error
        return self._error(f"not valid YAML: {what}", path=self.source, line=line, column=column)

    def error(self, node: yaml.Node | None, message: str) -> LocatedError:
        if node is None:
            return self._error(message, path=self.source)
        mark = node.start_mark
        return self._error(message, path=self.source, line=mark.line + 1, column=mark.column + 1)

    def value(self, node: yaml.Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        # A tag SafeLoader refuses (YAMLError), or one whose constructor fails on the
        # value (`!!int deny`, `!!timestamp 2020-13-45`: ValueError and kin).
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
            mark = node.start_mark
            raise self._error(
                f"not a usable YAML value: {' '.join(str(exc).split())[:300]}",
                path=self.source,
                line=mark.line + 1,
                column=mark.column + 1,
            ) from exc

    def string(self, node: yaml.Node, where: str) -> str:
        value = self.value(node)
        if not isinstance(value, str) or not value:
            raise self.error(node, f"{where}: must be a non-empty string")
        return value

    def mapping(self, node: yaml.Node, where: str, keys: set[str]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{where}: must be a mapping")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if not isinstance(key, str) or key not in keys:
                known = ", ".join(sorted(keys))
                raise self.error(key_node, f"{where}: unknown key {key!r} (known: {known})")
            if key in out:
                raise self.error(key_node, f"{where}: {key!r} appears twice")
            out[key] = value_node
        return out

    def sequence(self, node: yaml.Node, where: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, f"{where}: must be a list")
        return list(node.value)

    def strings(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        items = [self.value(n) for n in self.sequence(node, where)]
        if not items or not all(isinstance(i, str) and i for i in items):
            raise self.error(node, f"{where}: must be a list of non-empty strings")
        return tuple(items)
