"""`workspaces:` -- which directories each agent's calls work in.

    workspaces:
      - name: default                 # the daemon's --workspace (no root: it has one)
        agents: [role:operator]
      - name: home                    # what calls name (`workspace` on a request)
        root: workspaces/{agent}      # each agent its own directory
      - name: "{agent}-scratch"       # {agent} may be in the name too
        root: /srv/scratch/{agent}
      - name: shared
        root: /srv/shared
        agents: [group:builders]      # who may use it: names/globs, group:G, role:R

An agent is given every entry whose `agents` cover it (every agent if absent), in
file order; a call that names none works in the first. `{agent}` is the agent's
identity name, which holds no `/` and never starts with `.` (identity.NAME_PATTERN),
so it is always one safe path component. A relative root is relative to the
daemon's working directory, as `--workspace` is. Without a `workspaces:` section
every agent is given `default` alone: one workspace, as before there were several.

Roots are resolved, opened and made (if missing) by the pipeline
(`pipeline/workspaces.py`); the policy only says who gets which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from execgate.executor.core.errors import LocatedError
from execgate.executor.core.requests import DEFAULT_WORKSPACE
from execgate.executor.core.yamldoc import YamlDoc

from .model import agent_matches

WORKSPACE_KEYS = {"name", "root", "agents"}
AGENT = "{agent}"
# What a workspace name may hold once `{agent}` is put in: an identity name's
# characters, so it fits a journal column, a log line and a CLI argument as it is.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")


@dataclass(frozen=True, slots=True)
class WorkspaceRule:
    """One `workspaces:` entry, as written (templates unexpanded)."""

    name: str
    # "" for `default`: the daemon's --workspace.
    root: str
    agents: tuple[str, ...]
    # Where it is declared (`workspaces[1]`): refusals name it.
    field: str

    def covers(self, agent: str, memberships: frozenset[str]) -> bool:
        return agent_matches(self.agents, agent, memberships)


@dataclass(frozen=True, slots=True)
class Grant:
    """A workspace given to one agent: its name and root with `{agent}` put in."""

    name: str
    # "" for `default`: the daemon's --workspace.
    root: str
    field: str = ""


# Who gets what when the policy has no `workspaces:`: everyone the daemon's --workspace.
EVERYONE_DEFAULT = (Grant(DEFAULT_WORKSPACE, ""),)


def grants_for(
    rules: tuple[WorkspaceRule, ...], agent: str, memberships: frozenset[str]
) -> tuple[Grant, ...]:
    """The workspaces the agent may use, in file order (the first is its default); a
    name two entries give it is the first one's."""
    if not rules:
        return EVERYONE_DEFAULT
    out: dict[str, Grant] = {}
    for rule in rules:
        if rule.covers(agent, memberships):
            name = rule.name.replace(AGENT, agent)
            out.setdefault(name, Grant(name, rule.root.replace(AGENT, agent), rule.field))
    return tuple(out.values())


def workspace_rule(doc: YamlDoc, node: yaml.Node, where: str) -> WorkspaceRule:
    keys = doc.mapping(node, where, WORKSPACE_KEYS)
    if "name" not in keys:
        raise doc.error(node, f"{where}.name: required (what calls name the workspace by)")
    name = doc.string(keys["name"], f"{where}.name")
    _check_template(doc, keys["name"], name, f"{where}.name")
    if not NAME_PATTERN.fullmatch(name.replace(AGENT, "a")):
        raise doc.error(
            keys["name"],
            f"{where}.name: {name[:80]!r} is not a workspace name (letters, digits, '.', "
            "'_', '@', '-', starting with a letter or digit; {agent} for the agent's name)",
        )
    root = ""
    if "root" in keys:
        root = doc.string(keys["root"], f"{where}.root")
        _check_template(doc, keys["root"], root, f"{where}.root")
        if name == DEFAULT_WORKSPACE:
            raise doc.error(
                keys["root"],
                f"{where}.root: `default` is the daemon's --workspace; it takes no root",
            )
        if not root or "\x00" in root:
            raise doc.error(keys["root"], f"{where}.root: must be a path")
    elif name != DEFAULT_WORKSPACE:
        raise doc.error(node, f"{where}.root: required (the directory its calls work in)")
    agents = doc.strings(keys["agents"], f"{where}.agents") if "agents" in keys else ()
    return WorkspaceRule(name, root, agents, where)


def _check_template(doc: YamlDoc, node: yaml.Node, text: str, where: str) -> None:
    """`{agent}` is the one placeholder; any other brace is a mistake, not a character."""
    rest = text.replace(AGENT, "")
    if "{" in rest or "}" in rest:
        raise doc.error(node, f"{where}: {text[:80]!r}: the only placeholder is {AGENT}")


def check_unique(
    doc: YamlDoc, nodes: list[yaml.Node], rules: list[tuple[int, WorkspaceRule]]
) -> list[LocatedError]:
    """Two entries with the same name (as written) would leave one of them unreachable."""
    seen: dict[str, int] = {}
    errors: list[LocatedError] = []
    for i, rule in rules:
        first = seen.setdefault(rule.name, i)
        if first != i:
            errors.append(
                doc.error(
                    nodes[i], f"{rule.field}.name: {rule.name!r} is workspaces[{first}]'s too"
                )
            )
    return errors
