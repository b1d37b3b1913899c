"""Templates over a call's arguments: `{name}` is the argument `name`, `{{`/`}}` are braces.

A template expands to exactly one string, whatever the argument holds; only a whole
argv element `{name...}` spreads an array argument into one element per item. No
shell ever sees the result, so `;`, `$(...)`, backticks, globs and spaces are plain
characters. A template whose argument is absent (an optional property the call did
not give) expands to nothing: the argv element, effect or stdin is left out.

Argument values: a string as it is; an integer or a number as JSON writes it;
true/false as `true`/`false`; an array or object (outside a spread) as its JSON text.
A NUL byte in an expanded value is REJECTED invalid_argument naming the argument.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from execgate.executor.core.errors import ExecgateError, invalid

__all__ = ["Template", "TemplateSyntaxError", "parse", "spread_name"]

_NAME = r"[A-Za-z_][A-Za-z0-9_-]*"
_TOKEN = re.compile(r"\{\{|\}\}|\{(" + _NAME + r")\}|\{|\}")
_SPREAD = re.compile(r"^\{(" + _NAME + r")\.\.\.\}$")


class TemplateSyntaxError(ExecgateError, ValueError):
    """A template that does not parse (an unmatched brace, a bad name)."""


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed template: literal text and argument names, in order."""

    text: str
    parts: tuple[tuple[bool, str], ...]  # (is_argument, literal or name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(value for is_arg, value in self.parts if is_arg)

    def expand(self, args: dict[str, Any]) -> str | None:
        """The template filled in; None when one of its arguments is absent."""
        out = []
        for is_arg, value in self.parts:
            if not is_arg:
                out.append(value)
                continue
            if args.get(value) is None:
                return None
            text = render(args[value])
            if "\x00" in text:
                raise invalid(f"arguments.{value}: contains a NUL byte", f"arguments.{value}")
            out.append(text)
        return "".join(out)

    def leader(self, args: dict[str, Any]) -> str | None:
        """The argument whose text begins the expansion (None when a literal does):
        the one to blame when the element starts with `-`."""
        for is_arg, value in self.parts:
            if not is_arg:
                return None
            if args.get(value) is not None and render(args[value]):
                return value
        return None


def parse(text: str) -> Template:
    """`text` as a template; TemplateSyntaxError naming what is wrong."""
    parts: list[tuple[bool, str]] = []
    at = 0
    for m in _TOKEN.finditer(text):
        if m.start() > at:
            parts.append((False, text[at : m.start()]))
        token = m.group(0)
        if token in ("{{", "}}"):
            parts.append((False, token[0]))
        elif m.group(1) is not None:
            parts.append((True, m.group(1)))
        else:
            raise TemplateSyntaxError(
                f"unmatched {token!r} at character {m.start() + 1} (write {token * 2} "
                f"for a literal brace; a placeholder is {{name}})"
            )
        at = m.end()
    if at < len(text):
        parts.append((False, text[at:]))
    return Template(text, tuple(parts))


def spread_name(text: str) -> str | None:
    """The argument of a whole-element spread `{name...}`, else None."""
    m = _SPREAD.match(text)
    return m.group(1) if m else None


def render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def spread(name: str, args: dict[str, Any]) -> list[str]:
    """The items of the array argument `name`, one string each (none if absent)."""
    items = args.get(name)
    if items is None:
        return []
    if not isinstance(items, list):
        return _checked(name, [render(items)])
    return _checked(name, [render(item) for item in items])


def _checked(name: str, values: list[str]) -> list[str]:
    for i, value in enumerate(values):
        if "\x00" in value:
            raise invalid(f"arguments.{name}[{i}]: contains a NUL byte", f"arguments.{name}[{i}]")
    return values
