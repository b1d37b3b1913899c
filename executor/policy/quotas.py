"""`quotas:` -- how much of the daemon one agent may take at once.

    quotas:
      - agents: ["*"]            # whom it limits: names/globs, group:G, role:R (all if absent)
        concurrent: 8            # calls of one agent running at once
        per_second: 20           # calls of one agent joining the lock queue per second
        burst: 40                # ... of which this many at once after a quiet spell
        queued: 500              # calls of one agent waiting to start
        over: wait               # beyond concurrent / per_second: wait (default) or reject

Each agent is counted on its own (its identity name): the limits are per agent,
not shared by every agent an entry matches. Every entry covering the agent
applies and, per limit, the smallest value wins (as for `limits:`); the entry that
set a limit also says what a call beyond it does, and is named in the refusal
(`quotas[1].concurrent`). A call over `queued` is always REJECTED: waiting for a
place in a queue would itself be queueing. The pipeline enforces them
(`pipeline/quota.py`, the lock manager's caps).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

import yaml

from execgate.executor.core import ranges
from execgate.executor.core.yamldoc import YamlDoc

from .model import agent_matches


class Over(enum.Enum):
    """What a call beyond `concurrent` or `per_second` does."""

    WAIT = "wait"  # it waits (holding nothing) until the agent is under the limit
    REJECT = "reject"  # REJECTED resource_exhausted, at once


# The policy's field -> its range.
QUOTA_RANGES = {
    "concurrent": ranges.Range(low=1, high=10_000, integer=True, unit="calls"),
    "per_second": ranges.Range(high=100_000, positive=True, unit="calls per second"),
    "burst": ranges.Range(low=1, high=100_000, integer=True, unit="calls"),
    "queued": ranges.Range(low=1, high=1_000_000, integer=True, unit="calls"),
}
QUOTA_VALUES = tuple(QUOTA_RANGES)
QUOTA_KEYS = {"agents", "over", *QUOTA_VALUES}


@dataclass(frozen=True, slots=True)
class Bound:
    """One limit in force: its value, the field that set it, what a call beyond it does."""

    value: float
    # Where it was set: `quotas[1].concurrent`; refusals and WAITING marks name it.
    field: str
    over: Over = Over.WAIT


@dataclass(frozen=True, slots=True)
class Quota:
    """The limits on one agent (None: none set)."""

    concurrent: Bound | None = None
    per_second: Bound | None = None
    # The calls a burst may take at once (with per_second; ceil(per_second) if unset).
    burst: Bound | None = None
    queued: Bound | None = None

    def tighten(self, other: Quota) -> Quota:
        return Quota(
            _least(self.concurrent, other.concurrent),
            _least(self.per_second, other.per_second),
            _least(self.burst, other.burst),
            _least(self.queued, other.queued),
        )

    @property
    def cap(self) -> int:
        """The concurrent-call cap the lock manager keeps (0: none)."""
        return int(self.concurrent.value) if self.concurrent is not None else 0

    @property
    def bucket(self) -> int:
        """How many calls a quiet agent may send at once within `per_second`."""
        if self.burst is not None:
            return int(self.burst.value)
        rate = self.per_second.value if self.per_second is not None else 1.0
        return max(1, math.ceil(rate))


NO_QUOTA = Quota()


@dataclass(frozen=True, slots=True)
class QuotaRule:
    """One `quotas:` entry: whom it covers and what it sets."""

    agents: tuple[str, ...] = ()
    quota: Quota = field(default_factory=Quota)

    def covers(self, agent: str, memberships: frozenset[str]) -> bool:
        return agent_matches(self.agents, agent, memberships)


def quota_for(rules: tuple[QuotaRule, ...], agent: str, memberships: frozenset[str]) -> Quota:
    """The tightest value of each limit among the entries covering the agent."""
    found = NO_QUOTA
    for rule in rules:
        if rule.covers(agent, memberships):
            found = found.tighten(rule.quota)
    return found


def quota_rule(doc: YamlDoc, node: yaml.Node, where: str) -> QuotaRule:
    keys = doc.mapping(node, where, QUOTA_KEYS)
    values = {
        k: _in_range(doc, keys[k], f"{where}.{k}", r) for k, r in QUOTA_RANGES.items() if k in keys
    }
    if not values:
        raise doc.error(node, f"{where}: sets no limit ({', '.join(QUOTA_VALUES)})")
    over = Over.WAIT
    if "over" in keys:
        text = doc.value(keys["over"])
        if text not in ("wait", "reject"):
            raise doc.error(keys["over"], f"{where}.over: must be wait or reject, not {text!r}")
        over = Over(text)
    if "burst" in values and "per_second" not in values:
        raise doc.error(keys["burst"], f"{where}.burst: only with per_second (a rate's burst)")
    bounds = {k: Bound(v, f"{where}.{k}", over) for k, v in values.items()}
    agents = doc.strings(keys["agents"], f"{where}.agents") if "agents" in keys else ()
    return QuotaRule(agents, replace(NO_QUOTA, **bounds))


def _in_range(doc: YamlDoc, node: yaml.Node, where: str, allowed: ranges.Range) -> float:
    try:
        return allowed.check(where, doc.value(node))
    except ranges.SettingError as exc:
        raise doc.error(node, str(exc)) from None


def _least(a: Bound | None, b: Bound | None) -> Bound | None:
    if a is None:
        return b
    return a if b is None or a.value <= b.value else b
