"""Authorization: may this call run, must someone approve it, or is it denied?

The policy file's format and its checks are in `load`, the rules and precedence
in `model`. A `Policy` is immutable: a reload builds a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

from execgate.executor.core.errors import PolicyError, ToolError
from execgate.executor.core.outcomes import ErrorClass, Status

from .load import load_text, read_file
from .model import Decision, Effect, PolicyInput, Rule, decide, path_glob
from .quotas import NO_QUOTA, Bound, Over, Quota, QuotaRule, quota_for
from .reads import ReadGrant, readable
from .runrules import CallLimits, LimitRule, SandboxRule, limits_for
from .workspaces import Grant, WorkspaceRule, grants_for

__all__ = [
    "Bound",
    "CallLimits",
    "Decision",
    "Effect",
    "Grant",
    "Over",
    "Policy",
    "PolicyError",
    "PolicyInput",
    "Quota",
    "ReadGrant",
    "Rule",
    "SandboxRule",
    "default_policy_path",
    "load_policy",
    "parse_policy",
    "path_glob",
]


# At most this many (tool, agent) answers kept per policy (Policy._memo).
MEMO_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class Policy:
    default: Effect
    rules: tuple[Rule, ...]
    # sha256 of the file's bytes: which policy made a decision.
    revision: str
    source: str
    sandbox: tuple[SandboxRule, ...] = ()
    limits: tuple[LimitRule, ...] = ()
    # `hard_links:` path globs where a file with several hard links is not refused.
    hard_links: tuple[str, ...] = ()
    # `reads:` grants: whose journal records agents read beyond their own.
    reads: tuple[ReadGrant, ...] = ()
    # `quotas:`: how much of the daemon one agent may take at once.
    quotas: tuple[QuotaRule, ...] = ()
    # `workspaces:`: which directories agents' calls work in (empty: `default` for all).
    workspaces: tuple[WorkspaceRule, ...] = ()

    # What depends only on the tool, the agent and its memberships (the rules that may
    # concern a call, its limits, its quotas), worked out at a call's first decision
    # and kept for this policy's life: a reload builds a new Policy, with a new memo.
    _memo: dict[tuple[Any, ...], Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def decide(self, call: PolicyInput) -> Decision:
        key = ("rules", call.tool, call.agent, call.memberships)
        rules = self._memo.get(key)
        if rules is None:
            concern = (call.tool, call.agent, call.memberships)
            rules = self._remember(key, tuple(r for r in self.rules if r.concerns(*concern)))
        return decide(rules, self.default, self.revision, call, concerned=True)

    def require(self, call: PolicyInput) -> Decision:
        """The decision unless it denies the call; else the REJECTED ToolError to answer with."""
        return self.enforce(self.decide(call))

    def enforce(self, decision: Decision) -> Decision:
        """`decision` if it allows or asks (`decision.ask`: the caller parks the call
        for an approver, see executor.approve); raise the REJECTED ToolError of a deny."""
        if decision.effect is not Effect.DENY:
            return decision
        rules = ", ".join(decision.rule_ids) or "default"
        message = f"denied by policy ({rules}): {decision.reason}"
        raise ToolError(ErrorClass.POLICY_DENIED, message, field="tool", status=Status.REJECTED)

    def sandbox_for(
        self, tool: str, agent: str = "local", memberships: frozenset[str] = frozenset()
    ) -> SandboxRule | None:
        """The first sandbox rule covering the call (None: daemon defaults, no network)."""
        return next((r for r in self.sandbox if r.scope.covers(tool, agent, memberships)), None)

    def limits_for(self, call: PolicyInput) -> CallLimits:
        """The timeout, grace and output cap the `limits:` section sets for `call`."""
        key = ("limits", call.tool, call.agent, call.memberships)
        found = self._memo.get(key)
        if found is None:
            found = self._remember(
                key, limits_for(self.limits, call.tool, call.agent, call.memberships)
            )
        return cast(CallLimits, found)

    def quota_for(self, agent: str, memberships: frozenset[str] = frozenset()) -> Quota:
        """The `quotas:` limits on this agent's calls (NO_QUOTA: none)."""
        if not self.quotas:
            return NO_QUOTA
        key = ("quota", agent, memberships)
        found = self._memo.get(key)
        if found is None:
            found = self._remember(key, quota_for(self.quotas, agent, memberships))
        return cast(Quota, found)

    def _remember(self, key: tuple[Any, ...], value: Any) -> Any:
        if len(self._memo) >= MEMO_ENTRIES:  # a bound, however many tools and agents
            self._memo.clear()
        self._memo[key] = value
        return value

    def hard_links_allowed(self, rel: str) -> bool:
        """May a regular file with more than one hard link at `rel` (canonical,
        workspace-relative) be read or replaced? Only where `hard_links:` says so."""
        return any(path_glob(rel, pattern) for pattern in self.hard_links)

    def readable(self, agent: str, memberships: frozenset[str] = frozenset()) -> tuple[str, ...]:
        """Whose records (names or * ? globs) `reads:` lets this agent read."""
        return readable(self.reads, agent, memberships)

    def workspaces_for(
        self, agent: str, memberships: frozenset[str] = frozenset()
    ) -> tuple[Grant, ...]:
        """The workspaces `workspaces:` gives this agent, its default first (none: it
        may run no call)."""
        return grants_for(self.workspaces, agent, memberships)


def parse_policy(text: str, source: str) -> Policy:
    p = load_text(text, source)
    return Policy(
        p.default,
        p.rules,
        p.revision,
        source,
        p.sandbox,
        p.limits,
        p.hard_links,
        p.reads,
        p.quotas,
        p.workspaces,
    )


def load_policy(path: str | Path) -> Policy:
    text, source = read_file(path)
    return parse_policy(text, source)


def default_policy_path() -> Path:
    return Path(str(resources.files("execgate.policies").joinpath("default.yaml")))
