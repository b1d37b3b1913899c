"""Reading a policy file: YAML with every error at file:line:column, naming the field.

The file is composed into YAML nodes (which keep their positions), validated
against the policy's JSON Schema (`schema`: every error of the file), then built
node by node: unknown keys, wrong types, duplicate keys and bad values are
errors, never ignored. Each rule's inline `examples` are run against the rule
itself at load; one that does not come out as written refuses the file.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import regex
import yaml

from execgate.executor.core.errors import LocatedError, PolicyError
from execgate.executor.core.regexbound import check_pattern
from execgate.executor.core.yamldoc import YamlDoc as _Doc

from .model import Condition, Effect, PolicyInput, Rule, memberships
from .quotas import QuotaRule, quota_rule
from .reads import ReadGrant, read_grant
from .runrules import LimitRule, SandboxRule, limit_rule, sandbox_rule
from .schema import duplicate_keys, raise_all, schema_errors
from .workspaces import WorkspaceRule, check_unique, workspace_rule

FILE_KEYS = {
    "version", "default", "mode", "rules", "sandbox", "limits", "hard_links", "reads", "quotas",
    "workspaces",
}  # fmt: skip
RULE_KEYS = {
    "id",
    "effect",
    "reason",
    "agents",
    "tools",
    "paths",
    "tables",
    "hosts",
    "argv_prefix",
    "when",
    "mode",
    "approvers",
    "ttl",
    "examples",
}
MATCHERS = ("agents", "tools", "paths", "tables", "hosts", "argv_prefix", "when")
EXAMPLE_KEYS = {"tool", "agent", "groups", "roles", "paths", "tables", "hosts", "argv", "args"}
CONDITION_OPS = ("equals", "in", "matches")
DEFAULT_TTL = 3600.0
# A `when: matches` regex runs on every call's argument: bounded at load.
MAX_MATCHES_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Parsed:
    default: Effect
    rules: tuple[Rule, ...]
    sandbox: tuple[SandboxRule, ...]
    limits: tuple[LimitRule, ...]
    revision: str
    # Path globs under which hard-linked regular files are used like any other.
    hard_links: tuple[str, ...] = ()
    # `reads:` grants: whose records agents may read beyond their own.
    reads: tuple[ReadGrant, ...] = ()
    # `quotas:` entries: how much of the daemon one agent may take at once.
    quotas: tuple[QuotaRule, ...] = ()
    # `workspaces:` entries: which directories agents' calls work in (empty: `default`).
    workspaces: tuple[WorkspaceRule, ...] = ()


def load_text(text: str, source: str) -> Parsed:
    """The policy in `text`; PolicyErrors naming every error found, in file order.

    The schema (policy.schema) goes first and reports everything it sees; what it
    cannot see is checked entry by entry below, every entry's first error reported.
    """
    doc = _Doc(text, source, PolicyError)
    root = doc.root()
    if root is None:
        raise PolicyError("empty file: a policy has version, default, rules", path=source)
    raise_all(sorted(duplicate_keys(doc, root) + schema_errors(doc, root), key=_position))
    top = doc.mapping(root, "file", FILE_KEYS)
    version = doc.value(top["version"]) if "version" in top else None
    if isinstance(version, bool) or version != 1:
        raise doc.error(top.get("version", root), "version: must be 1")
    default = _effect(doc, top.get("default"), "default", allowed=(Effect.ALLOW, Effect.DENY))
    shadow_file = _shadow(doc, top.get("mode"), "mode")
    errors: list[LocatedError] = []
    each = functools.partial(_each, doc, top, errors)
    rules = each("rules", lambda n, where: _rule(doc, n, where, shadow_file))
    seen: set[str] = set()
    for i, rule in rules:
        if rule.id in seen:
            errors.append(
                doc.error(top["rules"].value[i], f"rules[{i}].id: {rule.id!r} is used twice")
            )
        seen.add(rule.id)
    sandbox = each("sandbox", lambda n, where: sandbox_rule(doc, n, where))
    limits = each("limits", lambda n, where: limit_rule(doc, n, where))
    hard_links = doc.strings(top["hard_links"], "hard_links") if "hard_links" in top else ()
    reads = each("reads", lambda n, where: read_grant(doc, n, where))
    quotas = each("quotas", lambda n, where: quota_rule(doc, n, where))
    spaces = each("workspaces", lambda n, where: workspace_rule(doc, n, where))
    if spaces:
        errors += check_unique(doc, doc.sequence(top["workspaces"], "workspaces"), spaces)
    raise_all(sorted(errors, key=_position))
    revision = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
    return Parsed(
        default,
        tuple(r for _, r in rules),
        tuple(r for _, r in sandbox),
        tuple(r for _, r in limits),
        revision,
        hard_links,
        tuple(r for _, r in reads),
        tuple(r for _, r in quotas),
        tuple(r for _, r in spaces),
    )


T = TypeVar("T")


def _each(
    doc: _Doc,
    top: dict[str, yaml.Node],
    errors: list[LocatedError],
    key: str,
    build: Callable[[yaml.Node, str], T],
) -> list[tuple[int, T]]:
    """`build` for each entry of the list `key`, with its index; an entry that does not
    build adds its error to `errors` and is left out."""
    out: list[tuple[int, T]] = []
    for i, node in enumerate(doc.sequence(top[key], key) if key in top else []):
        try:
            out.append((i, build(node, f"{key}[{i}]")))
        except PolicyError as exc:
            errors.append(exc)
    return out


def _position(err: LocatedError) -> tuple[int, int]:
    return (err.line, err.column)


def read_file(path: str | Path) -> tuple[str, str]:
    """(text, source) of a policy file; PolicyError if it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8"), str(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read policy: {exc}", path=str(path)) from exc


def _effect(
    doc: _Doc, node: yaml.Node | None, where: str, *, allowed: tuple[Effect, ...]
) -> Effect:
    if node is None:
        return Effect.DENY
    value = doc.value(node)
    names = [e.value for e in allowed]
    if value not in names:
        raise doc.error(node, f"{where}: must be {' or '.join(names)}, not {value!r}")
    return Effect(value)


def _shadow(doc: _Doc, node: yaml.Node | None, where: str) -> bool:
    if node is None:
        return False
    value = doc.value(node)
    if value not in ("enforce", "shadow"):
        raise doc.error(node, f"{where}: must be enforce or shadow, not {value!r}")
    return bool(value == "shadow")


def _rule(doc: _Doc, node: yaml.Node, where: str, shadow_file: bool) -> Rule:
    keys = doc.mapping(node, where, RULE_KEYS)
    rid = doc.value(keys["id"]) if "id" in keys else None
    if not isinstance(rid, str) or not rid:
        raise doc.error(keys.get("id", node), f"{where}.id: required, a non-empty string")
    if "effect" not in keys:
        raise doc.error(node, f"{where}.effect: required (allow, ask or deny)")
    effect = _effect(doc, keys["effect"], f"{where}.effect", allowed=tuple(Effect))
    if not any(m in keys for m in MATCHERS):
        raise doc.error(node, f"{where}: needs at least one matcher ({', '.join(MATCHERS)})")
    reason = doc.value(keys["reason"]) if "reason" in keys else ""
    names: dict[str, Any] = {
        m: doc.strings(keys[m], f"{where}.{m}")
        for m in ("agents", "tools", "paths", "tables", "hosts")
        if m in keys
    }
    rule = Rule(
        id=rid,
        effect=effect,
        reason=str(reason),
        argv_prefix=_argv_prefix(doc, keys.get("argv_prefix"), f"{where}.argv_prefix"),
        when=_conditions(doc, keys.get("when"), f"{where}.when"),
        shadow=shadow_file or _shadow(doc, keys.get("mode"), f"{where}.mode"),
        **names,
        **_asking(doc, keys, effect, where),
    )
    if "examples" in keys:
        _check_examples(doc, rule, keys["examples"], f"{where}.examples")
    return rule


def _asking(doc: _Doc, keys: dict[str, yaml.Node], effect: Effect, where: str) -> dict[str, Any]:
    if effect is not Effect.ASK:
        for key in ("approvers", "ttl"):
            if key in keys:
                raise doc.error(keys[key], f"{where}.{key}: only an ask rule has {key}")
        return {}
    if "approvers" not in keys:
        raise doc.error(keys["effect"], f"{where}.approvers: an ask rule names who may approve")
    approvers = doc.strings(keys["approvers"], f"{where}.approvers")
    ttl = doc.value(keys["ttl"]) if "ttl" in keys else DEFAULT_TTL
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
        raise doc.error(keys["ttl"], f"{where}.ttl: seconds, a positive number")
    return {"approvers": approvers, "ttl": float(ttl)}


def _argv_prefix(doc: _Doc, node: yaml.Node | None, where: str) -> tuple[tuple[str, ...], ...]:
    """One prefix as a list of tokens, or a list of such lists."""
    if node is None:
        return ()
    items = doc.sequence(node, where)
    if items and all(isinstance(n, yaml.SequenceNode) for n in items):
        return tuple(doc.strings(n, f"{where}[{i}]") for i, n in enumerate(items))
    return (doc.strings(node, where),)


def _conditions(doc: _Doc, node: yaml.Node | None, where: str) -> tuple[Condition, ...]:
    if node is None:
        return ()
    out = []
    for i, item in enumerate(doc.sequence(node, where)):
        here = f"{where}[{i}]"
        keys = doc.mapping(item, here, {"arg", *CONDITION_OPS})
        ops = [op for op in CONDITION_OPS if op in keys]
        arg = doc.value(keys["arg"]) if "arg" in keys else None
        if not isinstance(arg, str) or len(ops) != 1:
            raise doc.error(item, f"{here}: needs `arg` and exactly one of {CONDITION_OPS}")
        value = doc.value(keys[ops[0]])
        if ops[0] == "in" and not isinstance(value, list):
            raise doc.error(keys["in"], f"{here}.in: must be a list")
        if ops[0] == "matches":
            why = check_pattern(value, MAX_MATCHES_CHARS) if isinstance(value, str) else None
            if why is not None:
                raise doc.error(keys["matches"], f"{here}.matches: {why}")
            try:
                re.compile(value)
                regex.compile(value)  # what runs it (model.Condition: with a time limit)
            except (re.error, regex.error, TypeError, OverflowError, RecursionError) as exc:
                raise doc.error(keys["matches"], f"{here}.matches: not a regex: {exc}") from None
        out.append(Condition(arg, ops[0], value))
    return tuple(out)


def _check_examples(doc: _Doc, rule: Rule, node: yaml.Node, where: str) -> None:
    keys = doc.mapping(node, where, {"match", "not_match"})
    for kind, expect in (("match", True), ("not_match", False)):
        for i, item in enumerate(
            doc.sequence(keys[kind], f"{where}.{kind}") if kind in keys else []
        ):
            here = f"{where}.{kind}[{i}]"
            call = _example(doc, item, here)
            if rule.matches(call) is not expect:
                verb = "does not match" if expect else "matches"
                raise doc.error(item, f"{here}: rule {rule.id!r} {verb} this example")


def _example(doc: _Doc, node: yaml.Node, where: str) -> PolicyInput:
    keys = doc.mapping(node, where, EXAMPLE_KEYS)
    if "tool" not in keys:
        raise doc.error(node, f"{where}.tool: required")
    lists = {
        k: doc.strings(keys[k], f"{where}.{k}") for k in ("paths", "tables", "hosts") if k in keys
    }
    argv = doc.strings(keys["argv"], f"{where}.argv") if "argv" in keys else None
    args = doc.value(keys["args"]) if "args" in keys else {}
    if not isinstance(args, dict):
        raise doc.error(keys["args"], f"{where}.args: must be a mapping")
    groups, roles = (
        doc.strings(keys[k], f"{where}.{k}") if k in keys else () for k in ("groups", "roles")
    )
    return PolicyInput(
        tool=str(doc.value(keys["tool"])),
        agent=str(doc.value(keys["agent"])) if "agent" in keys else "local",
        memberships=memberships(groups, roles),
        argv=argv,
        args=args,
        **lists,
    )
