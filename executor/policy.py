"""Authorization: may this call run? (starter engine)

Decision order is independent of rule order: any matching deny wins over any
matching allow; no match falls to the file's default, which is deny unless the
file says otherwise. This engine matches on tool names only; the policy issue
replaces it with identities, paths, commands and approvals, keeping `decide`.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .errors import PolicyError, ToolError
from .outcomes import ErrorClass, Status

RULE_KEYS = {"id", "effect", "tools", "reason"}
FILE_KEYS = {"version", "default", "rules", "sandbox"}
SANDBOX_KEYS = {"tools", "backend", "network", "limits"}
BACKENDS = ("default", "process", "bwrap", "docker")
# Policy limit name -> (Confinement field, multiplier).
LIMIT_KEYS = {
    "cpu_seconds": ("cpu_seconds", 1),
    "memory_mb": ("memory_bytes", 1 << 20),
    "file_size_mb": ("file_size_bytes", 1 << 20),
    "open_files": ("open_files", 1),
    "processes": ("processes", 1),
}


class Effect(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    effect: Effect
    tools: tuple[str, ...]
    reason: str

    def matches(self, tool: str) -> bool:
        return any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.tools)


@dataclass(frozen=True, slots=True)
class SandboxRule:
    """Where a matching tool runs: the first rule whose globs match applies."""

    tools: tuple[str, ...]
    # "default" (the daemon's --sandbox), "process", "bwrap" or "docker".
    backend: str = "default"
    network: bool = False
    # Confinement field -> value, overriding the daemon's defaults.
    limits: tuple[tuple[str, int], ...] = ()

    def matches(self, tool: str) -> bool:
        return any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.tools)


@dataclass(frozen=True, slots=True)
class Decision:
    effect: Effect
    rule_ids: tuple[str, ...]
    reason: str
    revision: str


@dataclass(frozen=True, slots=True)
class Policy:
    default: Effect
    rules: tuple[Rule, ...]
    # sha256 of the file's bytes: which policy made a decision.
    revision: str
    source: str
    sandbox: tuple[SandboxRule, ...] = ()

    def sandbox_for(self, tool: str) -> SandboxRule | None:
        """The first sandbox rule matching `tool` (None: daemon defaults, no network)."""
        return next((r for r in self.sandbox if r.matches(tool)), None)

    def require(self, tool: str) -> Decision:
        """The decision if it allows the call; else a REJECTED policy_denied ToolError."""
        decision = self.decide(tool)
        if decision.effect is not Effect.ALLOW:
            rules = ", ".join(decision.rule_ids) or "default"
            raise ToolError(
                ErrorClass.POLICY_DENIED,
                f"denied by policy ({rules}): {decision.reason}",
                field="tool",
                status=Status.REJECTED,
            )
        return decision

    def decide(self, tool: str) -> Decision:
        matched = [r for r in self.rules if r.matches(tool)]
        for effect in (Effect.DENY, Effect.ALLOW):
            hits = [r for r in matched if r.effect is effect]
            if hits:
                return Decision(effect, tuple(r.id for r in hits), hits[0].reason, self.revision)
        return Decision(
            self.default, (), f"no rule matches; default {self.default.value}", self.revision
        )


def default_policy_path() -> Path:
    return Path(str(resources.files("execgate.policies").joinpath("default.yaml")))


def load_policy(path: str | Path) -> Policy:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"cannot read policy: {exc.strerror}", path=str(path)) from exc
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)  # only a MarkedYAMLError has one
        line = mark.line + 1 if mark else 0
        raise PolicyError(f"not valid YAML: {exc}", path=str(path), line=line) from exc
    return _parse(doc, str(path), hashlib.sha256(data).hexdigest())


def _parse(doc: Any, source: str, revision: str) -> Policy:
    if not isinstance(doc, dict):
        raise PolicyError("a policy file is a mapping with version, default, rules", path=source)
    _no_unknown(doc, FILE_KEYS, "file", source)
    if doc.get("version") != 1:
        raise PolicyError("version: must be 1", path=source)
    default = _effect(doc.get("default", "deny"), "default", source)
    raw_rules = doc.get("rules") or []
    if not isinstance(raw_rules, list):
        raise PolicyError("rules: must be a list", path=source)
    rules = tuple(_rule(r, i, source) for i, r in enumerate(raw_rules))
    ids = [r.id for r in rules]
    if len(set(ids)) != len(ids):
        raise PolicyError("rules: rule ids must be unique", path=source)
    raw_sandbox = doc.get("sandbox") or []
    if not isinstance(raw_sandbox, list):
        raise PolicyError("sandbox: must be a list", path=source)
    sandbox = tuple(_sandbox_rule(r, i, source) for i, r in enumerate(raw_sandbox))
    return Policy(default, rules, revision, source, sandbox)


def _rule(raw: Any, index: int, source: str) -> Rule:
    where = f"rules[{index}]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: must be a mapping", path=source)
    _no_unknown(raw, RULE_KEYS, where, source)
    tools = raw.get("tools")
    if not isinstance(raw.get("id"), str) or not raw["id"]:
        raise PolicyError(f"{where}.id: required, a non-empty string", path=source)
    if not isinstance(tools, list) or not tools or not all(isinstance(t, str) for t in tools):
        raise PolicyError(f"{where}.tools: required, a list of tool names or globs", path=source)
    effect = _effect(raw.get("effect"), f"{where}.effect", source)
    return Rule(raw["id"], effect, tuple(tools), str(raw.get("reason", "")))


def _sandbox_rule(raw: Any, index: int, source: str) -> SandboxRule:
    where = f"sandbox[{index}]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: must be a mapping", path=source)
    _no_unknown(raw, SANDBOX_KEYS, where, source)
    tools = raw.get("tools")
    if not isinstance(tools, list) or not tools or not all(isinstance(t, str) for t in tools):
        raise PolicyError(f"{where}.tools: required, a list of tool names or globs", path=source)
    backend = raw.get("backend", "default")
    if backend not in BACKENDS:
        raise PolicyError(f"{where}.backend: must be one of {', '.join(BACKENDS)}", path=source)
    network = raw.get("network", False)
    if not isinstance(network, bool):
        raise PolicyError(f"{where}.network: must be true or false", path=source)
    limits = raw.get("limits") or {}
    if not isinstance(limits, dict):
        raise PolicyError(f"{where}.limits: must be a mapping", path=source)
    _no_unknown(limits, set(LIMIT_KEYS), f"{where}.limits", source)
    parsed = []
    for name, value in limits.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise PolicyError(f"{where}.limits.{name}: must be a positive integer", path=source)
        field, unit = LIMIT_KEYS[name]
        parsed.append((field, value * unit))
    return SandboxRule(tuple(tools), backend, network, tuple(parsed))


def _effect(value: Any, where: str, source: str) -> Effect:
    try:
        return Effect(value)
    except ValueError:
        raise PolicyError(f"{where}: must be allow or deny, not {value!r}", path=source) from None


def _no_unknown(mapping: dict[str, Any], allowed: set[str], where: str, source: str) -> None:
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise PolicyError(f"{where}: unknown key {unknown[0]!r}", path=source)
