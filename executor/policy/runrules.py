"""How a call runs, as the policy file sets it: where (`sandbox:`) and within what
limits (`limits:`), per tool and per agent.

`sandbox:` entries apply first-match (the first entry whose `tools` and `agents`
match decides the backend, network and resource limits); they are fixed at
daemon start, since backends are probed and built then. `limits:` entries all
apply: for each limit the smallest value among the matching entries wins, so
their order does not matter (as for rules) and adding an entry can only tighten.
Both are hot-reloaded with the rest of the file, except that a changed
`sandbox:` section is refused until restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import yaml

from execgate.executor.core import ranges
from execgate.executor.core.yamldoc import YamlDoc

from .globs import glob_match
from .model import agent_matches

SANDBOX_KEYS = {"tools", "agents", "backend", "network", "limits"}
BACKENDS = ("default", "process", "bwrap", "docker")
# Policy limit name -> (Confinement field, multiplier).
CONFINEMENT_KEYS = {
    "cpu_seconds": ("cpu_seconds", 1),
    "memory_mb": ("memory_bytes", 1 << 20),
    "file_size_mb": ("file_size_bytes", 1 << 20),
    "open_files": ("open_files", 1),
    "processes": ("processes", 1),
}
# Policy limit name -> its range (ranges.py), in the policy's units.
LIMIT_RANGES = {
    "timeout_s": ranges.TIMEOUT,
    "grace_s": ranges.GRACE,
    "output_cap_kb": ranges.OUTPUT_CAP_KB,
    "file_cap_kb": ranges.FILE_CAP_KB,
}
LIMIT_VALUES = tuple(LIMIT_RANGES)
LIMIT_KEYS = {"tools", "agents", *LIMIT_VALUES}
N = TypeVar("N", int, float)


@dataclass(frozen=True, slots=True)
class Scope:
    """Which calls an entry is about: tool globs and `agents` entries (empty: all)."""

    tools: tuple[str, ...]
    agents: tuple[str, ...] = ()

    def covers(self, tool: str, agent: str, memberships: frozenset[str]) -> bool:
        return any(glob_match(tool, p) for p in self.tools) and agent_matches(
            self.agents, agent, memberships
        )


@dataclass(frozen=True, slots=True)
class SandboxRule:
    """Where a matching call runs: the first rule that covers it applies."""

    scope: Scope
    # "default" (the daemon's --sandbox), "process", "bwrap" or "docker".
    backend: str = "default"
    network: bool = False
    # Confinement field -> value, overriding the daemon's defaults.
    limits: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class CallLimits:
    """What the policy sets for one call; None: the daemon's setting stands."""

    # Upper bound on the call's timeout (seconds).
    timeout: float | None = None
    # The grace period between the polite signal and force (seconds).
    grace: float | None = None
    # Bytes of result text that go back to the model.
    output_cap: int | None = None
    # Largest file the file tools read whole or produce (edit_file), in bytes.
    file_cap: int | None = None

    def tighten(self, other: CallLimits) -> CallLimits:
        return CallLimits(
            _least(self.timeout, other.timeout),
            _least(self.grace, other.grace),
            _least(self.output_cap, other.output_cap),
            _least(self.file_cap, other.file_cap),
        )


@dataclass(frozen=True, slots=True)
class LimitRule:
    scope: Scope
    limits: CallLimits


def limits_for(
    rules: tuple[LimitRule, ...], tool: str, agent: str, memberships: frozenset[str]
) -> CallLimits:
    """The tightest value of each limit among the entries that cover the call."""
    found = CallLimits()
    for rule in rules:
        if rule.scope.covers(tool, agent, memberships):
            found = found.tighten(rule.limits)
    return found


def sandbox_rule(doc: YamlDoc, node: yaml.Node, where: str) -> SandboxRule:
    keys = doc.mapping(node, where, SANDBOX_KEYS)
    backend = doc.value(keys["backend"]) if "backend" in keys else "default"
    if backend not in BACKENDS:
        raise doc.error(keys["backend"], f"{where}.backend: must be one of {', '.join(BACKENDS)}")
    network = doc.value(keys["network"]) if "network" in keys else False
    if not isinstance(network, bool):
        raise doc.error(keys["network"], f"{where}.network: must be true or false")
    limits = (
        doc.mapping(keys["limits"], f"{where}.limits", set(CONFINEMENT_KEYS))
        if "limits" in keys
        else {}
    )
    parsed = []
    for name, value_node in limits.items():
        field, unit = CONFINEMENT_KEYS[name]
        value = _in_range(
            doc, value_node, f"{where}.limits.{name}", ranges.confinement_range(field, unit)
        )
        parsed.append((field, int(value) * unit))
    return SandboxRule(_scope(doc, node, keys, where), backend, network, tuple(parsed))


def limit_rule(doc: YamlDoc, node: yaml.Node, where: str) -> LimitRule:
    keys = doc.mapping(node, where, LIMIT_KEYS)
    values = {
        k: float(_in_range(doc, keys[k], f"{where}.{k}", r))
        for k, r in LIMIT_RANGES.items()
        if k in keys
    }
    if not values:
        raise doc.error(node, f"{where}: sets no limit ({', '.join(LIMIT_VALUES)})")
    cap, file_cap = values.get("output_cap_kb"), values.get("file_cap_kb")
    limits = CallLimits(
        timeout=values.get("timeout_s"),
        grace=values.get("grace_s"),
        output_cap=int(cap * 1024) if cap is not None else None,
        file_cap=int(file_cap * 1024) if file_cap is not None else None,
    )
    return LimitRule(_scope(doc, node, keys, where), limits)


def _scope(doc: YamlDoc, node: yaml.Node, keys: dict[str, yaml.Node], where: str) -> Scope:
    if "tools" not in keys:
        raise doc.error(node, f"{where}.tools: required, a list of tool names or globs")
    tools = doc.strings(keys["tools"], f"{where}.tools")
    agents = doc.strings(keys["agents"], f"{where}.agents") if "agents" in keys else ()
    return Scope(tools, agents)


def _in_range(doc: YamlDoc, node: yaml.Node, where: str, allowed: ranges.Range) -> float:
    try:
        return allowed.check(where, doc.value(node))
    except ranges.SettingError as exc:
        raise doc.error(node, str(exc)) from None


def _least(a: N | None, b: N | None) -> N | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
