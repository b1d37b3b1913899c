"""`execgate policy explain` against the daemon (the ExplainPolicy RPC), through the client.

Its own module so that the rest of `execgate policy` (check, test, explain --policy FILE)
never imports grpc.
"""

from __future__ import annotations

import argparse
from typing import Any

from execgate.client import PolicyExplanation
from execgate.executor.policy.explain import Explanation, RuleVerdict

from . import common

# A hung daemon ends the command after this long (DEADLINE_EXCEEDED) instead of never.
TIMEOUT_S = 30.0


def explain_remote(args: argparse.Namespace, values: dict[str, Any]) -> Explanation:
    """Asked of the daemon (ExplainPolicy), against the policy it enforces now."""
    with common.client(args, identity="operator") as eg:
        found = eg.explain_policy(
            args.tool,
            agent=args.agent or "",
            groups=args.group,
            roles=args.role,
            paths=args.path,
            tables=args.table,
            hosts=args.host,
            arguments=values,
            timeout=TIMEOUT_S,
        )
    return explanation(found)


def explanation(e: PolicyExplanation) -> Explanation:
    """The client's answer as `execgate policy explain` prints it, the same as from a file."""
    d = e.decision
    return Explanation(
        effect=d.effect,
        rule_ids=d.rule_ids,
        reason=e.reason,
        revision=d.revision,
        shadow=tuple(_split_shadow(s) for s in d.shadow),
        rules=tuple(RuleVerdict(r.rule_id, r.effect, r.shadow, r.not_matched_by) for r in e.rules),
        approvers=d.approvers,
        ttl=e.approval_ttl,
        runs_with=e.runs_with,
        source=e.source,
    )


def _split_shadow(text: str) -> tuple[str, str]:
    """ "rule_id:effect" (the client's form) as (rule_id, effect)."""
    rid, _, effect = text.rpartition(":")
    return rid, effect
