"""Whose journal records a caller may read: its own, everyone's, or what the policy adds.

    operator, admin (and `local`)    everyone's calls, runs and approvals
    approver                         everyone's approvals (it sees what waits anyway)
    agent                            its own records, plus the `of` agents of every
                                     policy `reads:` grant naming it (policy/reads.py)

A record outside the caller's scope is answered as one that does not exist
(NOT_FOUND, the same message), and left out of lists: an agent learns nothing of
another's calls, not even that they exist.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from . import Policy
from .identity import Identity, Role

READS_ALL = frozenset({Role.OPERATOR, Role.ADMIN})
READS_ALL_APPROVALS = READS_ALL | {Role.APPROVER}


@dataclass(frozen=True, slots=True)
class Scope:
    # None: everyone's records. Else agent names or * ? globs (the caller's own first).
    agents: tuple[str, ...] | None

    def allows(self, agent: str) -> bool:
        return self.agents is None or any(fnmatch.fnmatchcase(agent, p) for p in self.agents)


EVERYONE = Scope(None)


def scope_of(who: Identity, policy: Policy, *, approvals: bool = False) -> Scope:
    """What `who` may read under `policy` (the one in force at the request)."""
    if who.holds_any(READS_ALL_APPROVALS if approvals else READS_ALL):
        return EVERYONE
    granted = policy.readable(who.name, who.memberships())
    return Scope((who.name, *(p for p in granted if p != who.name)))
