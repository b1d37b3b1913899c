"""Reading a tools file (or a tools.d/ directory): YAML -> the values of `decl`.

Every error says file:line:column and names the field (`tools[2].argv[1]`);
unknown keys, duplicate keys and wrong types are errors, never ignored. What can
be checked without running anything is checked here: each input schema is a valid
JSON Schema (Draft 2020-12) of an object, every `{placeholder}` names one of its
properties, names are unique across the file(s) and clash with no built-in tool,
backends and limits are ones the sandbox has. A directory is every `*.yaml` in it,
sorted by name; its errors name the file they are in. The format is written in
docs/tools.md; tools/tools.schema.json is its JSON Schema for editors (a test holds
the two to the same keys).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import yaml

from execgate.executor.core.errors import LocatedError, ToolFileError, ToolFileErrors
from execgate.executor.core.yamldoc import YamlDoc

from . import toolparts
from .decl import CommandDecl, Located, ServerDecl, ToolFile
from .toolparts import COMMAND_KEYS, FILE_KEYS, SERVER_KEYS

__all__ = [
    "COMMAND_KEYS",
    "FILE_KEYS",
    "SERVER_KEYS",
    "bundle",
    "load_tools",
    "parse_bundle",
    "parse_sources",
    "read_sources",
]

T = TypeVar("T")


def load_tools(path: str | Path, reserved: frozenset[str] = frozenset()) -> ToolFile:
    """The tools declared in the file or directory at `path`; ToolFileErrors naming
    every error found. `reserved`: names already taken (the built-in tools)."""
    return parse_sources(read_sources(path), reserved)


def read_sources(path: str | Path) -> tuple[tuple[str, str], ...]:
    """(source, text) of the file, or of each `*.yaml` of the directory, sorted."""
    where = Path(path)
    files = sorted(where.glob("*.yaml")) if where.is_dir() else [where]
    out = []
    for file in files:
        try:
            out.append((str(file), file.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolFileError(f"cannot read tools file: {exc}", path=str(file)) from exc
    return tuple(out)


def bundle(sources: Sequence[tuple[str, str]]) -> str:
    """The sources as one text (what the reload watcher hashes and hands back)."""
    return json.dumps([list(s) for s in sources], ensure_ascii=False)


def parse_bundle(text: str, source: str, reserved: frozenset[str] = frozenset()) -> ToolFile:
    """`parse_sources` of a `bundle`'s text."""
    del source  # each file names itself
    return parse_sources([(s, t) for s, t in json.loads(text)], reserved)


def parse_sources(
    sources: Sequence[tuple[str, str]], reserved: frozenset[str] = frozenset()
) -> ToolFile:
    """Every file parsed, then the names checked across them all."""
    errors: list[LocatedError] = []
    commands: list[CommandDecl] = []
    servers: list[ServerDecl] = []
    for text, source in ((t, s) for s, t in sources):
        try:
            c, s = _parse_text(text, source)
        except ToolFileErrors as exc:
            errors.extend(exc.errors)
            continue
        except ToolFileError as exc:
            errors.append(exc)
            continue
        commands += c
        servers += s
    errors += _clashes(commands, servers, reserved)
    if errors:
        raise ToolFileErrors(errors)
    digest = hashlib.sha256(bundle(sources).encode("utf-8", errors="surrogatepass"))
    return ToolFile(commands=tuple(commands), servers=tuple(servers), revision=digest.hexdigest())


def _parse_text(text: str, source: str) -> tuple[list[CommandDecl], list[ServerDecl]]:
    doc = YamlDoc(text, source, ToolFileError)
    root = doc.root()
    if root is None:  # an empty file declares nothing (a tools.d/ placeholder)
        return [], []
    top = doc.mapping(root, "file", FILE_KEYS)
    version = doc.value(top["version"]) if "version" in top else None
    if isinstance(version, bool) or version != 1:
        raise doc.error(top.get("version", root), "version: required, must be 1")
    errors: list[LocatedError] = []
    commands = _each(doc, top, errors, "tools", toolparts.command)
    servers = _each(doc, top, errors, "servers", toolparts.server)
    if errors:
        raise ToolFileErrors(sorted(errors, key=lambda e: (e.line, e.column)))
    return commands, servers


def _each(
    doc: YamlDoc,
    top: dict[str, yaml.Node],
    errors: list[LocatedError],
    key: str,
    build: Callable[[YamlDoc, yaml.Node, str], T],
) -> list[T]:
    """`build` for each entry of the list `key`; an entry that does not build adds its
    first error to `errors` and is left out."""
    out: list[T] = []
    try:
        nodes = doc.sequence(top[key], key) if key in top else []
    except ToolFileError as exc:
        errors.append(exc)
        return out
    for i, node in enumerate(nodes):
        try:
            out.append(build(doc, node, f"{key}[{i}]"))
        except ToolFileError as exc:
            errors.append(exc)
    return out


def _clashes(
    commands: Sequence[CommandDecl], servers: Sequence[ServerDecl], reserved: frozenset[str]
) -> list[LocatedError]:
    """A name given twice (across every file), or one a built-in tool has."""
    errors: list[LocatedError] = []
    seen: dict[str, Located] = {}
    named: list[tuple[str, str, Located]] = [("tool", c.name, c.at) for c in commands]
    named += [("server", s.name, s.at) for s in servers]
    for kind, name, at in named:
        if name in reserved:
            errors.append(_at(at, f"{kind} {name!r}: a built-in tool has this name"))
        elif name in seen:
            first = seen[name]
            errors.append(
                _at(at, f"{kind} {name!r}: already declared at {first.source}:{first.line}")
            )
        seen.setdefault(name, at)
    return errors


def _at(at: Located, message: str) -> ToolFileError:
    return ToolFileError(message, path=at.source, line=at.line)
