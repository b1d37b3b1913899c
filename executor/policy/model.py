"""What a policy is, and how it decides: rules, matchers, precedence.

A rule matches a call when every matcher it has matches. Matchers over sets the
call touches (paths, tables, hosts) are read the safe way round for each effect:
a `deny` or `ask` rule matches when ANY touched path matches one of its globs; an
`allow` rule only when the call touches at least one path and ALL of them match.
So one denied file among allowed ones is denied, and an allow rule about `src/**`
never lets a call that also writes `.env` through.

Precedence does not depend on rule order: any matching deny beats any matching
ask, which beats any matching allow; nothing matching means the file's default
(deny unless it says otherwise). Rules in `mode: shadow` are evaluated and
reported, never enforced.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import regex

from execgate.executor.core.errors import ExecgateError

from .globs import glob_match


class Effect(enum.Enum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


# Strongest first: the order precedence is decided in.
PRECEDENCE = (Effect.DENY, Effect.ASK, Effect.ALLOW)


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyInput:
    """What a decision looks at. Paths are canonical and workspace-relative (POSIX)."""

    tool: str
    agent: str = "local"
    # The agent's `group:G` and `role:R` entries (identity.Identity.memberships).
    memberships: frozenset[str] = frozenset()
    paths: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    # The command's argv, for command tools; None for the others.
    argv: tuple[str, ...] | None = None
    args: Mapping[str, Any] = field(default_factory=dict)


# A `when: matches` regex runs on an argument the model chose: a pattern that backtracks
# badly must not hold the daemon. Past this the policy cannot decide, and the call is
# refused (fail closed), naming the argument.
MATCH_SECONDS = 0.05


class Undecided(ExecgateError):
    """A condition could not be evaluated in time: the call cannot be allowed."""

    def __init__(self, arg: str, pattern: str) -> None:
        super().__init__(
            f"the policy could not decide: its `matches` regex {pattern[:60]!r} took longer "
            f"than {MATCH_SECONDS:g}s on arguments.{arg}"
        )
        self.arg = arg


@dataclass(frozen=True, slots=True)
class Condition:
    """`when:` -- one condition on an argument: equals, in, or matches (a regex)."""

    arg: str
    op: str
    value: Any

    def holds(self, args: Mapping[str, Any]) -> bool:
        if self.arg not in args:
            return False
        actual = args[self.arg]
        if self.op == "equals":
            return bool(actual == self.value)
        if self.op == "in":
            return actual in self.value
        if not isinstance(actual, str):
            return False
        try:
            return regex.fullmatch(self.value, actual, timeout=MATCH_SECONDS) is not None
        except TimeoutError:
            raise Undecided(self.arg, self.value) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    id: str
    effect: Effect
    reason: str = ""
    agents: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    # Token prefixes: ("git", "status") matches argv ["git", "status", "-s"], never
    # ["git", "status && rm -rf /"] nor ["sh", "-c", "git status"].
    argv_prefix: tuple[tuple[str, ...], ...] = ()
    when: tuple[Condition, ...] = ()
    shadow: bool = False
    # For `ask`: who may decide, and how long the request stays open (seconds).
    approvers: tuple[str, ...] = ()
    ttl: float | None = None

    def matches(self, call: PolicyInput) -> bool:
        return all(ok for _, ok in self._checks(call))

    def concerns(self, tool: str, agent: str, memberships: frozenset[str]) -> bool:
        """Its `agents` and `tools` matchers: what depends on who calls which tool only
        (Policy.decide works it out once per policy for each tool and agent)."""
        return agent_matches(self.agents, agent, memberships) and _names(self.tools, tool)

    def matches_rest(self, call: PolicyInput) -> bool:
        """Its other matchers, in `_checks`' order (a `when` regex runs last): with
        `concerns`, the same verdict as `matches`."""
        every = self.effect is Effect.ALLOW
        return (
            _touches(self.paths, call.paths, every=every, glob=path_glob)
            and _touches(self.tables, call.tables, every=every, glob=glob_match)
            and _touches(self.hosts, call.hosts, every=every, glob=glob_match)
            and self._argv_matches(call.argv)
            and all(c.holds(call.args) for c in self.when)
        )

    def mismatches(self, call: PolicyInput) -> tuple[str, ...]:
        """The matchers that do not match `call` (empty: the rule matches)."""
        return tuple(name for name, ok in self._checks(call) if not ok)

    def _checks(self, call: PolicyInput) -> Iterator[tuple[str, bool]]:
        """Each matcher's verdict, computed only when asked for (`matches` stops early)."""
        every = self.effect is Effect.ALLOW
        yield "agents", agent_matches(self.agents, call.agent, call.memberships)
        yield "tools", _names(self.tools, call.tool)
        yield "paths", _touches(self.paths, call.paths, every=every, glob=path_glob)
        yield "tables", _touches(self.tables, call.tables, every=every, glob=glob_match)
        yield "hosts", _touches(self.hosts, call.hosts, every=every, glob=glob_match)
        yield "argv_prefix", self._argv_matches(call.argv)
        yield "when", all(c.holds(call.args) for c in self.when)

    def _argv_matches(self, argv: tuple[str, ...] | None) -> bool:
        if not self.argv_prefix:
            return True
        if argv is None:
            return False
        return any(tuple(argv[: len(p)]) == p for p in self.argv_prefix)


def agent_matches(patterns: tuple[str, ...], name: str, memberships: frozenset[str]) -> bool:
    """An `agents` entry is a name glob, or `group:G` / `role:R` (matched exactly)."""
    return not patterns or any(
        p in memberships if p.startswith(MEMBERSHIP_PREFIXES) else glob_match(name, p)
        for p in patterns
    )


MEMBERSHIP_PREFIXES = ("group:", "role:")


def memberships(groups: Iterable[str], roles: Iterable[str]) -> frozenset[str]:
    """The `memberships` of a PolicyInput for an agent in `groups` holding `roles`."""
    return frozenset({f"group:{g}" for g in groups} | {f"role:{r}" for r in roles})


def _names(patterns: tuple[str, ...], name: str) -> bool:
    return not patterns or any(glob_match(name, p) for p in patterns)


def _touches(
    patterns: tuple[str, ...], touched: tuple[str, ...], *, every: bool, glob: Any
) -> bool:
    if not patterns:
        return True
    hit = [any(glob(item, p) for p in patterns) for item in touched]
    return bool(hit) and (all(hit) if every else any(hit))


def path_glob(path: str, pattern: str) -> bool:
    """`**` spans directories, `*` and `?` stay within one; `dir/` is dir and all below it.

    The policy's one glob syntax (policy.globs), as for every other matcher."""
    return glob_match(path, pattern)


@dataclass(frozen=True, slots=True)
class Decision:
    effect: Effect
    # The matching rules of the winning effect (empty: the default decided).
    rule_ids: tuple[str, ...]
    reason: str
    # sha256 of the policy file: which policy made the decision.
    revision: str
    # What shadow rules would have decided (rule id, effect); logged, not enforced.
    shadow: tuple[tuple[str, Effect], ...] = ()
    # The deciding `ask` rule, when the effect is ASK.
    ask: Rule | None = None


def decide(
    rules: tuple[Rule, ...],
    default: Effect,
    revision: str,
    call: PolicyInput,
    *,
    concerned: bool = False,
) -> Decision:
    """`concerned`: `rules` are those whose `concerns` holds for the call already."""
    matched = [r for r in rules if (r.matches_rest(call) if concerned else r.matches(call))]
    shadow = tuple((r.id, r.effect) for r in matched if r.shadow)
    live = [r for r in matched if not r.shadow]
    for effect in PRECEDENCE:
        hits = [r for r in live if r.effect is effect]
        if hits:
            ask = hits[0] if effect is Effect.ASK else None
            return Decision(
                effect, tuple(r.id for r in hits), hits[0].reason, revision, shadow, ask
            )
    reason = f"no rule matches; default {default.value}"
    return Decision(default, (), reason, revision, shadow)
