"""Why a policy decides a call the way it does: the decision, and every rule's verdict.

One `Explanation` is what `execgate policy explain` prints, computed from a file
(`--policy`) or by the daemon from the policy it enforces (the ExplainPolicy RPC);
the CLI renders both the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .model import Effect, PolicyInput

if TYPE_CHECKING:
    from . import Policy

__all__ = ["Explanation", "RuleVerdict", "canonical", "explain"]

UNSET = "daemon default"


@dataclass(frozen=True, slots=True)
class RuleVerdict:
    rule_id: str
    effect: str
    shadow: bool
    # The matchers that did not match the call (empty: the rule matches).
    not_matched_by: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    effect: str
    # The rules of the winning effect (empty: the file's default decided).
    rule_ids: tuple[str, ...]
    reason: str
    revision: str
    # Shadow rules that matched, with the effect they would have had.
    shadow: tuple[tuple[str, str], ...] = ()
    rules: tuple[RuleVerdict, ...] = ()
    # effect "ask": who may decide, and for how many seconds the approval stays open.
    approvers: tuple[str, ...] = ()
    ttl: float | None = None
    # The sandbox and limits the call would run with (UNSET where the policy is silent).
    runs_with: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def denied(self) -> bool:
        return self.effect == Effect.DENY.value

    def to_json(self) -> dict[str, Any]:
        return {
            "effect": self.effect,
            "rules": list(self.rule_ids),
            "reason": self.reason,
            "revision": self.revision,
            "shadow": [list(s) for s in self.shadow],
            "each_rule": [
                {
                    "id": r.rule_id,
                    "effect": r.effect,
                    "shadow": r.shadow,
                    "not_matched_by": list(r.not_matched_by),
                }
                for r in self.rules
            ],
            "approvers": list(self.approvers),
            "ttl": self.ttl,
            "runs_with": self.runs_with,
            "policy": self.source,
        }

    def lines(self) -> list[str]:
        """The human form, one line each."""
        by = ", ".join(self.rule_ids) or "default"
        out = [f"decision: {self.effect} ({by}): {self.reason}"]
        for r in self.rules:
            mode = " [shadow]" if r.shadow else ""
            verdict = (
                "matches"
                if not r.not_matched_by
                else "does not match: " + ", ".join(r.not_matched_by)
            )
            out.append(f"  {r.rule_id} ({r.effect}{mode}) {verdict}")
        if self.effect == Effect.ASK.value:
            ttl = f"{self.ttl:g}s" if self.ttl is not None else "its ttl"
            out.append(f"approval: needed from {', '.join(self.approvers)}, expires after {ttl}")
        out.append("runs with: " + ", ".join(f"{k} {v}" for k, v in self.runs_with.items()))
        out.append(f"policy {self.source} revision {self.revision[:12]}")
        return out


def explain(policy: Policy, call: PolicyInput) -> Explanation:
    decision = policy.decide(call)
    ask = decision.ask
    return Explanation(
        effect=decision.effect.value,
        rule_ids=decision.rule_ids,
        reason=decision.reason,
        revision=decision.revision,
        shadow=tuple((rid, eff.value) for rid, eff in decision.shadow),
        rules=tuple(
            RuleVerdict(r.id, r.effect.value, r.shadow, r.mismatches(call)) for r in policy.rules
        ),
        approvers=ask.approvers if ask is not None else (),
        ttl=ask.ttl if ask is not None else None,
        runs_with=_runs_with(policy, call),
        source=policy.source,
    )


def canonical(path: str) -> str:
    """Workspace-relative, normalised as the daemon does (`..` and `.` folded)."""
    norm = os.path.normpath(path).lstrip("/")
    return norm or "."


def _runs_with(policy: Policy, call: PolicyInput) -> dict[str, Any]:
    rule = policy.sandbox_for(call.tool, call.agent, call.memberships)
    limits = policy.limits_for(call)
    return {
        "sandbox": rule.backend if rule is not None else "default",
        "network": rule.network if rule is not None else False,
        "timeout_s": limits.timeout if limits.timeout is not None else UNSET,
        "grace_s": limits.grace if limits.grace is not None else UNSET,
        "output_cap_bytes": limits.output_cap if limits.output_cap is not None else UNSET,
    }
