"""What the policy sees of a validated call: its tool, agent, canonical paths, tables,
hosts, command argv and arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .calls import ValidCall
from .paths import Workspace
from .policy import Effect, Policy, PolicyInput

_TABLE_MARK = "\x00"  # locks.keys: the last part of a table key starts with it
_NET_ROOT = "net"


def policy_input(
    call: ValidCall, agent: str, memberships: frozenset[str], workspace: Workspace
) -> PolicyInput:
    """Paths are workspace-relative and canonical (validation resolved `..` and symlinks)."""
    tables, hosts = [], []
    for claim in call.effects.claims:
        parts = claim.key.parts
        if parts[0] == _NET_ROOT and len(parts) > 1:
            hosts.append(parts[1])
        elif parts[-1].startswith(_TABLE_MARK):
            tables.append(parts[-1][1:])
    argv = call.args.get("argv")
    return PolicyInput(
        tool=call.request.tool,
        agent=agent,
        memberships=memberships,
        paths=tuple(sorted({workspace.relative(p) for p in call.paths.values()})),
        tables=tuple(sorted(set(tables))),
        hosts=tuple(sorted(set(hosts))),
        argv=tuple(argv) if isinstance(argv, list) else None,
        args=call.args,
    )


def file_check(policy: Policy, call: PolicyInput, workspace: Workspace) -> Callable[[Path], bool]:
    """For tools that walk a tree: may this call read this one (canonical) path?

    The call was allowed for the tree it names; a deny rule may still cover files
    inside it (`.env` under `.`), which the tool must then skip.
    """

    def readable(path: Path) -> bool:
        if not workspace.contains(str(path)):
            return False
        one = replace(call, paths=(workspace.relative(path),))
        return policy.decide(one).effect is Effect.ALLOW

    return readable
