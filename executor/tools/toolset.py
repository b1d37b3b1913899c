"""The tools the daemon serves, as one immutable value swapped whole on reload.

A `ToolSet` holds every tool by name, its compiled argument validator and its
provider ("builtin", "command", "mcp:SERVER"). The dispatcher keeps one and
replaces it in one assignment when the tools file changes; a call takes the set
once, at validation, and keeps the Tool object it found there, so a call in flight
runs the definition it started with whatever is reloaded meanwhile.

Providers contribute tools through `ToolProvider`: `name` is the provider label,
`tools()` the tools it serves now (already listed: an MCP provider asks its servers
before the set is built, never while it is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import jsonschema

from execgate.executor.core.errors import ConfigError

from .base import CheckedTool, PlacedTool, Tool
from .decl import SandboxDecl, ToolFile
from .declared import CommandTool
from .effects import AnalysedTool, quick
from .schemabound import NO_RETRIEVAL, bounded_pattern, has_patterns
from .schemacheck import Check, compile_schema

__all__ = [
    "BoundedValidator",
    "SchemaValidator",
    "ToolProvider",
    "ToolSet",
    "Traits",
    "provider_of",
    "trusted_of",
]

# JSON Schema counts 2.0 as an integer; the tools index and slice with these values,
# so an "integer" argument must be a Python int (never a bool).
# (types-jsonschema leaves `extend` unannotated.)
SchemaValidator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, v: isinstance(v, int) and not isinstance(v, bool)
    ),
)
# The validator of a schema the daemon did not write (a declared or served tool's): its
# patterns are matched under a time budget (schemabound).
BoundedValidator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    SchemaValidator, validators={"pattern": bounded_pattern}
)

BUILTIN = "builtin"


class ToolProvider(Protocol):
    """Something that serves tools beside the built-ins (the MCP servers)."""

    @property
    def name(self) -> str:
        """The provider label ListTools shows ("mcp:git")."""
        ...

    def tools(self) -> Sequence[Tool]:
        """The tools served now; each name unique across the whole set."""
        ...


def provider_of(tool: Tool) -> str:
    """A tool's provider label: its `provider` attribute, "builtin" without one."""
    label = getattr(tool, "provider", BUILTIN)
    return label if isinstance(label, str) else BUILTIN


def trusted_of(tool: Tool) -> bool:
    """Whether a tool's effects are believed (ListTools' annotations_trusted): the
    daemon's own and the operator's are; an MCP tool says by `annotations_trusted`."""
    trusted = getattr(tool, "annotations_trusted", True)
    return trusted if isinstance(trusted, bool) else True


@dataclass(frozen=True, slots=True)
class Traits:
    """What validation and the runner ask of a tool on every call, answered once when
    the set is built: a runtime-checkable Protocol's isinstance walks the protocol's
    members each time (about 10 us a check, several per call)."""

    validator: Any  # SchemaValidator of its input schema
    # Its schema's fast path (schemacheck.py): True only for arguments the validator
    # accepts; None when the schema has none.
    fast: Check | None
    checked: bool  # a CheckedTool: `check(args)` after the schema
    analysed: bool  # an AnalysedTool: `call_effects` answers its claims
    # Its analysis may block (sql reads a database's schema): a worker thread runs it.
    blocking: bool
    # A PlacedTool's declaration of where it runs; None for the others.
    placement: SandboxDecl | None
    # Its schema's patterns are matched under a budget: validated off the event loop.
    patterned: bool = False

    @classmethod
    def of(cls, tool: Tool, *, builtin: bool = True) -> Traits:
        """A built-in's schema is the daemon's own; any other tool's (declared, served)
        has its references resolved inside it only (nothing fetched) and its patterns
        matched under a time budget (schemabound), so it gets no unbounded fast path."""
        schema = tool.spec.input_schema
        analysed = isinstance(tool, AnalysedTool)
        patterned = not builtin and has_patterns(schema)
        make = SchemaValidator if builtin else BoundedValidator
        return cls(
            validator=make(schema, registry=NO_RETRIEVAL),
            fast=None if patterned else compile_schema(schema),
            checked=isinstance(tool, CheckedTool),
            analysed=analysed,
            blocking=analysed and not quick(tool),
            placement=tool.placement if isinstance(tool, PlacedTool) else None,
            patterned=patterned,
        )


@dataclass(frozen=True, slots=True)
class ToolSet:
    # Invariant: `tools`, `traits` and `providers` have the same keys.
    tools: Mapping[str, Tool]
    traits: Mapping[str, Traits]
    providers: Mapping[str, str]
    # The tools file's revision ("" when the set is the built-ins alone).
    revision: str = ""
    # Tools whose schema's patterns are matched under a budget: validated off the loop.
    patterned: frozenset[str] = frozenset()

    @classmethod
    def build(
        cls,
        builtins: Iterable[Tool],
        commands: Iterable[Tool] = (),
        providers: Iterable[ToolProvider] = (),
        *,
        revision: str = "",
    ) -> ToolSet:
        """Every tool under its name; a name served twice is a ConfigError naming it."""
        found: dict[str, Tool] = {}
        labels: dict[str, str] = {}
        builtins = list(builtins)
        groups: list[tuple[str | None, Iterable[Tool]]] = [(None, builtins), (None, commands)]
        groups += [(p.name, p.tools()) for p in providers]
        for label, tools in groups:
            for tool in tools:
                name = tool.spec.name
                # A tool's own label first ("mcp:git"), then its provider's.
                by = getattr(tool, "provider", None) or label or BUILTIN
                if name in found:
                    raise ConfigError(f"tool {name!r} is served by {labels[name]} and {by}")
                found[name] = tool
                labels[name] = by
        ours = {t.spec.name for t in builtins}
        traits = {n: Traits.of(t, builtin=n in ours) for n, t in found.items()}
        return cls(
            MappingProxyType(found),
            MappingProxyType(traits),
            MappingProxyType(labels),
            revision,
        )

    @classmethod
    def of(cls, tools: Mapping[str, Tool] | ToolSet) -> ToolSet:
        """`tools` as a set (a plain mapping: tests, the built-ins alone)."""
        return tools if isinstance(tools, ToolSet) else cls.build(tools.values())

    @classmethod
    def declared(
        cls,
        builtins: Iterable[Tool],
        file: ToolFile,
        providers: Iterable[ToolProvider] = (),
    ) -> ToolSet:
        """The built-ins, the file's command tools, and what the providers serve."""
        commands = [CommandTool(decl) for decl in file.commands]
        return cls.build(builtins, commands, providers, revision=file.revision)

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def values(self) -> Iterable[Tool]:
        return self.tools.values()
