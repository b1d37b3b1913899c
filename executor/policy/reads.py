"""`reads:` -- whose journal records an agent may read beyond its own.

An agent reads its own calls, runs and approvals; operators and admins read
everyone's (`executor/policy/scope.py`). A `reads:` entry widens what agents read:

    reads:
      - agents: [auditor, group:reviewers]   # who reads: names/globs, group:G, role:R
        of: [build-agent, "ci-*"]            # whose records: agent names or * ? globs

`of` entries are matched in the journal's SQL (`GLOB`), so they hold only the
characters an identity name may hold, plus `*` and `?`.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

import yaml

from execgate.executor.core.yamldoc import YamlDoc

from .model import agent_matches

READ_KEYS = {"agents", "of"}
# Identity names (identity.NAME_PATTERN) with * and ? wildcards.
OF_PATTERN = re.compile(r"[A-Za-z0-9._@*?-]{1,64}")


@dataclass(frozen=True, slots=True)
class ReadGrant:
    # Who the grant is for (policy `agents` syntax).
    agents: tuple[str, ...]
    # Whose records they may read (names or * ? globs).
    of: tuple[str, ...]


def read_grant(doc: YamlDoc, node: yaml.Node, where: str) -> ReadGrant:
    keys = doc.mapping(node, where, READ_KEYS)
    for key in ("agents", "of"):
        if key not in keys:
            raise doc.error(node, f"{where}.{key}: required, a list of agent names")
    agents = doc.strings(keys["agents"], f"{where}.agents")
    of = doc.strings(keys["of"], f"{where}.of")
    for i, pattern in enumerate(of):
        if not OF_PATTERN.fullmatch(pattern):
            raise doc.error(
                keys["of"],
                f"{where}.of[{i}]: {pattern[:80]!r} is not an agent name or a * ? glob of one",
            )
    return ReadGrant(agents, of)


def readable(
    grants: tuple[ReadGrant, ...], name: str, memberships: frozenset[str]
) -> tuple[str, ...]:
    """The `of` patterns of every grant whose `agents` match this agent."""
    out: list[str] = []
    for grant in grants:
        if agent_matches(grant.agents, name, memberships):
            out.extend(p for p in grant.of if p not in out)
    return tuple(out)


def glob_allows(patterns: tuple[str, ...], agent: str) -> bool:
    return any(fnmatch.fnmatchcase(agent, p) for p in patterns)
