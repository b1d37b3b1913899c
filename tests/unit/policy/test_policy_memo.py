"""Policy.decide works out once per policy which rules may concern a tool and an agent;
its decisions are those of every rule matched against the whole call."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import execgate.executor.policy as policy_module
from execgate.executor.policy import Policy, PolicyInput, parse_policy
from execgate.executor.policy.model import decide

POLICY = """
version: 1
default: deny
rules:
  - id: secrets
    effect: deny
    paths: ["**/.env", "keys/"]
  - id: reads
    effect: allow
    tools: [read_file, "list_*"]
  - id: bots-write
    effect: allow
    agents: ["bot-*", "group:writers"]
    tools: [write_file]
    paths: ["src/**"]
  - id: ask-rm
    effect: ask
    tools: [run_command]
    argv_prefix: [rm]
    approvers: [approver]
  - id: commands
    effect: allow
    tools: [run_command]
    when: [{arg: cwd, in: [".", "src"]}]
  - id: try-deny-sql
    effect: deny
    mode: shadow
    tools: [sql]
    tables: ["secret*"]
quotas:
  - agents: ["bot-*"]
    concurrent: 2
limits:
  - tools: [run_command]
    agents: ["group:writers"]
    timeout_s: 5
"""

TOOLS = ["read_file", "list_dir", "write_file", "run_command", "sql", "noop"]
AGENTS = ["local", "bot-1", "carol"]
MEMBERSHIPS = [frozenset(), frozenset({"group:writers"})]
PATHS = [(), ("src/a.py",), (".env",), ("src/a.py", "keys/k"), ("docs/x",)]


def _policy() -> Policy:
    return parse_policy(POLICY, "test.yaml")


calls = st.builds(
    PolicyInput,
    tool=st.sampled_from(TOOLS),
    agent=st.sampled_from(AGENTS),
    memberships=st.sampled_from(MEMBERSHIPS),
    paths=st.sampled_from(PATHS),
    tables=st.sampled_from([(), ("secrets",), ("users",)]),
    argv=st.sampled_from([None, ("rm", "x"), ("ls",)]),
    args=st.sampled_from([{}, {"cwd": "."}, {"cwd": "docs"}]),
)


@settings(max_examples=300, deadline=None)
@given(calls)
def test_the_memoised_decision_is_every_rules_decision(call: PolicyInput) -> None:
    policy = _policy()
    for _ in range(2):  # the first decision fills the memo, the second reads it
        assert policy.decide(call) == decide(policy.rules, policy.default, policy.revision, call)


def test_limits_and_quotas_are_remembered_per_tool_and_agent() -> None:
    policy = _policy()
    writer = PolicyInput(tool="run_command", agent="carol", memberships=MEMBERSHIPS[1])
    assert policy.limits_for(writer).timeout == 5
    assert policy.limits_for(writer) is policy.limits_for(writer)
    assert policy.limits_for(PolicyInput(tool="run_command", agent="carol")).timeout is None
    assert policy.quota_for("bot-1").concurrent is not None
    assert policy.quota_for("carol").concurrent is None


def test_the_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_module, "MEMO_ENTRIES", 8)
    policy = _policy()
    for tool, agent in itertools.product(TOOLS, [f"a{i}" for i in range(10)]):
        policy.decide(PolicyInput(tool=tool, agent=agent))
        assert len(policy._memo) <= 8


def test_a_reloaded_policy_starts_with_an_empty_memo() -> None:
    first = _policy()
    first.decide(PolicyInput(tool="read_file"))
    assert first._memo
    assert not _policy()._memo
    assert first == _policy()  # the memo is no part of a policy's value
