"""The entries of a tools file, node by node: one command tool, one MCP server.

`toolfile` reads the file and calls these; each raises the first error of its
entry (a ToolFileError at the node, naming the field).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jsonschema
import yaml

from execgate.executor.core import ranges
from execgate.executor.core.yamldoc import YamlDoc
from execgate.executor.policy.runrules import BACKENDS, CONFINEMENT_KEYS

from . import template
from .decl import (
    MAX_MESSAGE_BYTES,
    CommandDecl,
    EffectsDecl,
    EnvDecl,
    Located,
    OutputMode,
    Pool,
    SandboxDecl,
    ServerDecl,
    ToolOverride,
)
from .schemabound import outside_ref, pattern_problem

FILE_KEYS = {"version", "tools", "servers"}
COMMAND_KEYS = {
    "name", "description", "input_schema", "argv", "cwd", "stdin", "env", "effects",
    "idempotent", "destructive", "sandbox", "timeout_s", "output", "success_codes",
    "option_args",
}  # fmt: skip
SERVER_KEYS = {
    "name", "command", "args", "cwd", "env", "trusted", "sandbox", "timeout_s", "prestart",
    "pool", "startup_timeout_s", "max_message_kb", "tools",
}  # fmt: skip
ENV_KEYS = {"set", "passthrough", "secrets"}
# An EffectsDecl's templates, in the order the tools file's schema lists them.
EFFECT_KINDS = ("reads", "writes", "read_tables", "write_tables", "net")
EFFECT_KEYS = set(EFFECT_KINDS)
SANDBOX_KEYS = {"backend", "limits"}
# A server's sandbox may also name its docker image.
SERVER_SANDBOX_KEYS = SANDBOX_KEYS | {"image"}
OVERRIDE_KEYS = {"effects", "read_only", "destructive", "idempotent", "hidden"}
COMMAND_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HOST = re.compile(r"^[A-Za-z0-9{}_.-]+$")
# A docker image reference as dockerd takes it: [registry[:port]/]path[:tag][@digest].
IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
TIMEOUT = ranges.TIMEOUT
MESSAGE_KB = ranges.MCP_MESSAGE_KB


def command(doc: YamlDoc, node: yaml.Node, where: str) -> CommandDecl:
    keys = doc.mapping(node, where, COMMAND_KEYS)
    for required in ("name", "description", "input_schema", "argv"):
        if required not in keys:
            raise doc.error(node, f"{where}.{required}: required")
    name = _name(doc, keys["name"], f"{where}.name", COMMAND_NAME, "no dot: dots are SERVER.TOOL")
    schema = input_schema(doc, keys["input_schema"], f"{where}.input_schema")
    props = schema.get("properties", {})
    argv = _argv(doc, keys["argv"], f"{where}.argv", props)
    cwd = _template(doc, keys["cwd"], f"{where}.cwd", props) if "cwd" in keys else "."
    stdin = _template(doc, keys["stdin"], f"{where}.stdin", props) if "stdin" in keys else None
    codes = _codes(doc, keys.get("success_codes"), f"{where}.success_codes")
    output = _choice(doc, keys.get("output"), f"{where}.output", OutputMode, OutputMode.TEXT)
    return CommandDecl(
        name=name,
        description=doc.string(keys["description"], f"{where}.description"),
        input_schema=schema,
        argv=argv,
        cwd=cwd,
        stdin=stdin,
        env=_env(doc, keys.get("env"), f"{where}.env"),
        effects=_effects(doc, keys.get("effects"), f"{where}.effects", props),
        idempotent=_flag(doc, keys.get("idempotent"), f"{where}.idempotent"),
        destructive=_flag(doc, keys.get("destructive"), f"{where}.destructive"),
        sandbox=_sandbox(doc, keys, where),
        output=output,
        success_codes=codes,
        option_args=_option_args(doc, keys.get("option_args"), f"{where}.option_args", props),
        at=_located(doc, node),
    )


def _option_args(
    doc: YamlDoc, node: yaml.Node | None, where: str, props: dict[str, Any]
) -> tuple[str, ...]:
    """The arguments allowed to begin an argv element with `-` (the program may read
    them as options): each a property of input_schema."""
    if node is None:
        return ()
    names = _strings(doc, node, where)
    for i, name in enumerate(names):
        _known(doc, node.value[i], f"{where}[{i}]", name, props)
    return names


def server(doc: YamlDoc, node: yaml.Node, where: str) -> ServerDecl:
    keys = doc.mapping(node, where, SERVER_KEYS)
    for required in ("name", "command"):
        if required not in keys:
            raise doc.error(node, f"{where}.{required}: required")
    name = _name(doc, keys["name"], f"{where}.name", COMMAND_NAME, "its tools are NAME.TOOL")
    args = _strings(doc, keys["args"], f"{where}.args") if "args" in keys else ()
    startup = (
        _seconds(doc, keys["startup_timeout_s"], f"{where}.startup_timeout_s")
        if "startup_timeout_s" in keys
        else 10.0
    )
    message_kb = (
        _bounded(doc, keys["max_message_kb"], f"{where}.max_message_kb", MESSAGE_KB)
        if "max_message_kb" in keys
        else MAX_MESSAGE_BYTES // ranges.KIB
    )
    return ServerDecl(
        name=name,
        command=doc.string(keys["command"], f"{where}.command"),
        args=args,
        cwd=doc.string(keys["cwd"], f"{where}.cwd") if "cwd" in keys else ".",
        env=_env(doc, keys.get("env"), f"{where}.env"),
        trusted=_flag(doc, keys.get("trusted"), f"{where}.trusted"),
        sandbox=_sandbox(doc, keys, where, server=True),
        prestart=_flag(doc, keys.get("prestart"), f"{where}.prestart"),
        pool=_choice(doc, keys.get("pool"), f"{where}.pool", Pool, Pool.DAEMON),
        startup_timeout=startup,
        max_message_bytes=int(message_kb) * ranges.KIB,
        tools=_overrides(doc, keys.get("tools"), f"{where}.tools"),
        at=_located(doc, node),
    )


def input_schema(doc: YamlDoc, node: yaml.Node, where: str) -> dict[str, Any]:
    """A JSON Schema (Draft 2020-12) of an object, with `properties` if it names any."""
    _no_duplicates(doc, node, where)
    value = doc.value(node)
    if not isinstance(value, dict):
        raise doc.error(node, f"{where}: must be a mapping (a JSON Schema)")
    try:
        jsonschema.Draft202012Validator.check_schema(value)
    except jsonschema.SchemaError as exc:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise doc.error(node, f"{where}{path}: not a valid JSON Schema: {exc.message}") from None
    ref = outside_ref(value)
    if ref is not None:
        raise doc.error(
            node, f"{where}: refers to {ref!r}; only references inside it (#...) are followed"
        )
    unbounded = pattern_problem(value)
    if unbounded is not None:
        raise doc.error(node, f"{where}: {unbounded}")
    if value.get("type") != "object":
        raise doc.error(node, f"{where}.type: must be object (a call's arguments are one)")
    props = value.get("properties", {})
    if not isinstance(props, dict):
        raise doc.error(node, f"{where}.properties: must be a mapping")
    return value


def _no_duplicates(doc: YamlDoc, node: yaml.Node, where: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[object] = set()
        for key_node, value_node in node.value:
            key = doc.value(key_node)
            if isinstance(key, str) and key in seen:
                raise doc.error(key_node, f"{where}: {key!r} appears twice")
            seen.add(key if isinstance(key, str) else id(key_node))
            _no_duplicates(doc, value_node, f"{where}.{key}")
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _no_duplicates(doc, item, f"{where}[{i}]")


def _argv(doc: YamlDoc, node: yaml.Node, where: str, props: dict[str, Any]) -> tuple[str, ...]:
    items = doc.sequence(node, where)
    if not items:
        raise doc.error(node, f"{where}: must not be empty")
    out = []
    for i, item in enumerate(items):
        here = f"{where}[{i}]"
        spread = template.spread_name(str(doc.value(item)))
        if spread is not None:
            if i == 0:
                raise doc.error(item, f"{here}: the program cannot be a spread")
            _known(doc, item, here, spread, props)
            if props[spread].get("type") != "array":
                raise doc.error(item, f"{here}: {{{spread}...}} spreads an array argument")
            out.append(str(doc.value(item)))
        else:
            out.append(_template(doc, item, here, props))
            if i == 0 and template.parse(out[0]).names:
                # The program is the operator's: an argument there picks any program
                # (`./scripts/{name}` with name `../../bin/sh`), or, left out, makes
                # argv[1] the program.
                raise doc.error(item, f"{here}: the program cannot hold a placeholder")
    return tuple(out)


def _template(doc: YamlDoc, node: yaml.Node, where: str, props: dict[str, Any]) -> str:
    value = doc.value(node)
    if not isinstance(value, str) or not value:
        raise doc.error(node, f"{where}: must be a non-empty string")
    try:
        parsed = template.parse(value)
    except template.TemplateSyntaxError as exc:
        raise doc.error(node, f"{where}: {exc}") from None
    for name in parsed.names:
        _known(doc, node, where, name, props)
    return value


def _known(doc: YamlDoc, node: yaml.Node, where: str, name: str, props: dict[str, Any]) -> None:
    if name not in props:
        raise doc.error(node, f"{where}: {_unknown(name, props, 'input_schema')}")


def _unknown(name: str, props: Mapping[str, Any], schema: str) -> str:
    known = ", ".join(sorted(props)) or "none"
    return f"{{{name}}} is not a property of {schema} (properties: {known})"


def effect_problem(key: str, text: str, props: Mapping[str, Any], schema: str) -> str:
    """Why an effects template (of `key`: reads, writes, ..., net) does not fit a tool
    whose input schema (called `schema` in the message) has `props` ("" if it fits):
    a placeholder that names no property, or, in a path or table, one typed array,
    object or boolean (no path is one). The loader asks it of a command tool, the MCP
    provider of a server's override once the server lists its tools."""
    for name in template.parse(text).names:
        if name not in props:
            return _unknown(name, props, schema)
        prop = props.get(name)
        kind = prop.get("type") if isinstance(prop, dict) else None
        if key != "net" and kind in ("array", "object", "boolean"):
            return f"{{{name}}} is of type {kind}: a path needs a string"
    return ""


def _env(doc: YamlDoc, node: yaml.Node | None, where: str) -> EnvDecl:
    if node is None:
        return EnvDecl()
    keys = doc.mapping(node, where, ENV_KEYS)
    fixed = _env_map(doc, keys.get("set"), f"{where}.set", values_are_names=False)
    secrets = _env_map(doc, keys.get("secrets"), f"{where}.secrets", values_are_names=True)
    passthrough: tuple[str, ...] = ()
    if "passthrough" in keys:
        passthrough = _strings(doc, keys["passthrough"], f"{where}.passthrough")
        for i, name in enumerate(passthrough):
            _env_name(doc, keys["passthrough"].value[i], f"{where}.passthrough[{i}]", name)
    names = [n for n, _ in fixed] + list(passthrough) + [n for n, _ in secrets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise doc.error(
            node, f"{where}: {twice[0]} is given in more than one of set/passthrough/secrets"
        )
    return EnvDecl(set=fixed, passthrough=passthrough, secrets=secrets)


def _env_map(
    doc: YamlDoc, node: yaml.Node | None, where: str, *, values_are_names: bool
) -> tuple[tuple[str, str], ...]:
    if node is None:
        return ()
    if not isinstance(node, yaml.MappingNode):
        raise doc.error(node, f"{where}: must be a mapping of variable names")
    out = []
    seen = set()
    for key_node, value_node in node.value:
        name = doc.value(key_node)
        _env_name(doc, key_node, where, name)
        if name in seen:
            raise doc.error(key_node, f"{where}: {name!r} appears twice")
        seen.add(name)
        value = doc.value(value_node)
        if not isinstance(value, str) or "\x00" in value:
            raise doc.error(value_node, f"{where}.{name}: must be a string without NUL")
        if values_are_names:
            _env_name(doc, value_node, f"{where}.{name}", value)
        out.append((name, value))
    return tuple(out)


def _env_name(doc: YamlDoc, node: yaml.Node, where: str, name: object) -> None:
    if not isinstance(name, str) or not ENV_NAME.match(name):
        raise doc.error(node, f"{where}: {name!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")


def _effects(
    doc: YamlDoc, node: yaml.Node | None, where: str, props: dict[str, Any]
) -> EffectsDecl:
    if node is None:
        return EffectsDecl()
    if isinstance(node, yaml.MappingNode) and not node.value:
        return EffectsDecl(declared=True)  # `effects: {}`: it touches nothing
    keys = doc.mapping(node, where, EFFECT_KEYS)
    found: dict[str, tuple[str, ...]] = {}
    for key, value_node in keys.items():
        here = f"{where}.{key}"
        items = doc.sequence(value_node, here)
        found[key] = tuple(
            _effect(doc, item, f"{here}[{i}]", key, props) for i, item in enumerate(items)
        )
    return EffectsDecl(declared=True, **found)


def _effect(doc: YamlDoc, node: yaml.Node, where: str, key: str, props: dict[str, Any]) -> str:
    text = _template(doc, node, where, props)
    problem = effect_problem(key, text, props, "input_schema")  # an override's: _ANY
    if problem:
        raise doc.error(node, f"{where}: {problem}")
    if key in ("reads", "writes") and text.startswith("/"):
        raise doc.error(node, f"{where}: paths are relative to the workspace, not {text!r}")
    if key.endswith("_tables"):
        path, sep, table = text.rpartition(":")
        if not sep or not path or not table or path.startswith("/"):
            raise doc.error(node, f"{where}: a table is DATABASE_PATH:TABLE, not {text!r}")
    if key == "net" and not HOST.match(text):
        raise doc.error(node, f"{where}: {text!r} is not a host name")
    return text


def _sandbox(
    doc: YamlDoc, keys: dict[str, yaml.Node], where: str, *, server: bool = False
) -> SandboxDecl:
    timeout = (
        _seconds(doc, keys["timeout_s"], f"{where}.timeout_s") if "timeout_s" in keys else None
    )
    if "sandbox" not in keys:
        return SandboxDecl(timeout=timeout)
    here = f"{where}.sandbox"
    box = doc.mapping(keys["sandbox"], here, SERVER_SANDBOX_KEYS if server else SANDBOX_KEYS)
    backend = doc.value(box["backend"]) if "backend" in box else "default"
    if backend not in BACKENDS:
        raise doc.error(box["backend"], f"{here}.backend: must be one of {', '.join(BACKENDS)}")
    image = _image(doc, box.get("image"), here, backend)
    limits = (
        doc.mapping(box["limits"], f"{here}.limits", set(CONFINEMENT_KEYS))
        if "limits" in box
        else {}
    )
    parsed = []
    for name, value_node in limits.items():
        field, unit = CONFINEMENT_KEYS[name]
        allowed = ranges.confinement_range(field, unit)
        try:
            value = allowed.check(f"{here}.limits.{name}", doc.value(value_node))
        except ranges.SettingError as exc:
            raise doc.error(value_node, str(exc)) from None
        parsed.append((field, int(value) * unit))
    return SandboxDecl(backend=backend, limits=tuple(parsed), timeout=timeout, image=image)


def _image(doc: YamlDoc, node: yaml.Node | None, where: str, backend: str) -> str:
    """A server's docker image: a reference dockerd could name, and only for docker (a
    server's command is then a path in the image, meaningless to another backend)."""
    if node is None:
        return ""
    text = doc.string(node, f"{where}.image")
    if not IMAGE.match(text):
        raise doc.error(node, f"{where}.image: {text!r} is not a docker image reference")
    if backend != "docker":
        raise doc.error(node, f"{where}.image: only with backend: docker, not {backend}")
    return text


def _overrides(
    doc: YamlDoc, node: yaml.Node | None, where: str
) -> tuple[tuple[str, ToolOverride], ...]:
    """Per-tool overrides of a server: tool name -> what the operator says about it.
    Their effects templates name the tool's arguments, which only the server knows:
    the MCP provider checks them against its schemas when it lists the tools
    (`effect_problem`, as for a command tool here)."""
    if node is None:
        return ()
    if not isinstance(node, yaml.MappingNode):
        raise doc.error(node, f"{where}: must be a mapping of tool names")
    out = []
    for key_node, value_node in node.value:
        tool = doc.value(key_node)
        if not isinstance(tool, str) or not tool:
            raise doc.error(key_node, f"{where}: a tool name must be a non-empty string")
        here = f"{where}.{tool}"
        keys = doc.mapping(value_node, here, OVERRIDE_KEYS)
        flags = {
            k: _flag(doc, keys[k], f"{here}.{k}")
            for k in ("read_only", "destructive", "idempotent")
            if k in keys
        }
        effects = (
            _effects(doc, keys["effects"], f"{here}.effects", _ANY) if "effects" in keys else None
        )
        hidden = _flag(doc, keys.get("hidden"), f"{here}.hidden")
        at = _located(doc, key_node)
        out.append((tool, ToolOverride(effects=effects, hidden=hidden, at=at, **flags)))
    return tuple(out)


class _AnyProperties(dict[str, Any]):
    """Every name is a property: a server's schema is only known once it runs."""

    def __contains__(self, key: object) -> bool:
        return True


_ANY = _AnyProperties()


def _name(doc: YamlDoc, node: yaml.Node, where: str, pattern: re.Pattern[str], why: str) -> str:
    value = doc.value(node)
    if not isinstance(value, str) or not pattern.match(value):
        raise doc.error(
            node, f"{where}: {value!r} is not a name ([A-Za-z_][A-Za-z0-9_-]*, at most 64; {why})"
        )
    return value


def _strings(doc: YamlDoc, node: yaml.Node, where: str) -> tuple[str, ...]:
    items = [doc.value(n) for n in doc.sequence(node, where)]
    for i, item in enumerate(items):
        if not isinstance(item, str) or "\x00" in item:
            raise doc.error(node.value[i], f"{where}[{i}]: must be a string without NUL")
    return tuple(items)


def _flag(doc: YamlDoc, node: yaml.Node | None, where: str) -> bool:
    if node is None:
        return False
    value = doc.value(node)
    if not isinstance(value, bool):
        raise doc.error(node, f"{where}: must be true or false")
    return value


def _seconds(doc: YamlDoc, node: yaml.Node, where: str) -> float:
    return float(_bounded(doc, node, where, TIMEOUT))


def _bounded(doc: YamlDoc, node: yaml.Node, where: str, allowed: ranges.Range) -> float:
    try:
        return allowed.check(where, doc.value(node))
    except ranges.SettingError as exc:
        raise doc.error(node, str(exc)) from None


def _codes(doc: YamlDoc, node: yaml.Node | None, where: str) -> tuple[int, ...]:
    if node is None:
        return (0,)
    items = doc.sequence(node, where)
    codes = [doc.value(n) for n in items]
    for i, code in enumerate(codes):
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
            raise doc.error(items[i], f"{where}[{i}]: must be an exit status, 0 to 255")
    if not codes:
        raise doc.error(node, f"{where}: must not be empty")
    return tuple(codes)


def _choice(doc: YamlDoc, node: yaml.Node | None, where: str, kind: Any, default: Any) -> Any:
    if node is None:
        return default
    value = doc.value(node)
    names = [m.value for m in kind]
    if value not in names:
        raise doc.error(node, f"{where}: must be one of {', '.join(names)}, not {value!r}")
    return kind(value)


def _located(doc: YamlDoc, node: yaml.Node) -> Located:
    return Located(source=doc.source, line=node.start_mark.line + 1)


__all__ = [
    "COMMAND_KEYS",
    "EFFECT_KINDS",
    "FILE_KEYS",
    "SERVER_KEYS",
    "command",
    "effect_problem",
    "input_schema",
    "server",
]
