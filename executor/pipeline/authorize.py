"""What the policy sees of a validated call: its tool, agent, canonical paths (relative
to the call's workspace), tables, hosts, command argv and arguments."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from execgate.executor.core import clock
from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.core.paths import Workspace
from execgate.executor.journal.store import PolicyRecord
from execgate.executor.policy import Effect, Policy, PolicyInput, Quota
from execgate.executor.policy.model import Undecided
from execgate.executor.tools.declared import Prepared

from .calls import Authorized, ValidCall

log = logging.getLogger("execgate.dispatch")

_TABLE_MARK = "\x00"  # locks.keys: the last part of a table key starts with it
_NET_ROOT = "net"


class Authorizer:
    """The policy in force, and who is in which group: decides each call."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        # An agent's `group:`/`role:` memberships, for policy `agents` entries. Set
        # (and swapped on an identities reload) by the server; none by default.
        self.memberships: Callable[[str], frozenset[str]] = lambda agent: frozenset()

    def input_for(self, call: ValidCall, agent: str) -> PolicyInput:
        return policy_input(call, agent, self.memberships(agent), call.workspace)

    def authorize(self, call: ValidCall, agent: str) -> Authorized:
        """The policy's decision on the call, even a deny (`enforce` refuses it: the
        refusal is journaled with the decision). Raises the REJECTED ToolError of a
        call the policy cannot decide (an argument it cannot read)."""
        began = clock.now()
        decided_on = self.input_for(call, agent)
        try:
            decision = self.policy.decide(decided_on)
        except Undecided as exc:
            raise ToolError(
                ErrorClass.POLICY_DENIED,
                str(exc),
                field=f"arguments.{exc.arg}",
                status=Status.REJECTED,
            ) from None
        span = (began, clock.now())
        shadow = tuple(f"{rule}:{effect.value}" for rule, effect in decision.shadow)
        record = PolicyRecord(decision.effect.value, decision.rule_ids, decision.revision, shadow)
        if shadow:  # rules being rolled out: what they would have done, never enforced
            log.info(
                "call %s: shadow rules %s (in force: %s)",
                call.request.call_id,
                ", ".join(shadow),
                decision.effect.value,
            )
        return Authorized(
            valid=call, policy_input=decided_on, decision=decision, record=record, span=span
        )

    def enforce(self, authorized: Authorized) -> None:
        """Raise the REJECTED ToolError of a call the policy denies."""
        self.policy.enforce(authorized.decision)

    def readable(self, authorized: Authorized) -> Callable[[Path], bool]:
        """Per-file answers for tree tools, on the input the call was decided on."""
        return file_check(self.policy, authorized.policy_input, authorized.valid.workspace)

    def quota(self, authorized: Authorized) -> Quota:
        """The policy in force's `quotas:` on the call's agent."""
        decided_on = authorized.policy_input
        return self.policy.quota_for(decided_on.agent, decided_on.memberships)

    def hard_links(self, workspace: Workspace) -> Callable[[Path], bool]:
        """Where the policy in force lets a tool use a file with several hard links (its
        globs are relative to the call's workspace)."""
        return hard_links_check(self.policy, workspace)


def hard_links_check(policy: Policy, workspace: Workspace) -> Callable[[Path], bool]:
    if not policy.hard_links:
        return lambda _path: False

    def allowed(path: Path) -> bool:
        inside = workspace.contains(str(path))
        return inside and policy.hard_links_allowed(workspace.relative(path))

    return allowed


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
    if isinstance(call.effects.detail, Prepared):  # a declared command: what it will run
        argv = list(call.effects.detail.argv)
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
