"""Per-tool, per-agent policy: the `limits:` section (timeout, grace, output cap; every
matching entry applies, the smallest value of each limit wins), `agents` entries
`group:G` / `role:R` in rules, sandbox rules and limits, and the policy decision an
Explain reports.

The loader and the matchers are tested without a daemon; tightest-wins is a property
(hypothesis) against an oracle written here from the docstring of
`executor.policy.runrules`. The rest runs a real daemon with an identities file (bot is
in the group `slow`, carol in none, olga is an operator and approver) and checks what a call got:
the outcome's timeline marks, its truncation, and the journaled policy events.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from execgate.client import Call, Client, EventKind, Outcome, Status, StopMode
from execgate.executor.cli.main import main
from execgate.executor.core.errors import IdentityError, PolicyError
from execgate.executor.policy import CallLimits, Effect, PolicyInput, parse_policy
from execgate.executor.policy.identity import hash_token, parse_identities
from execgate.executor.policy.model import agent_matches, memberships
from execgate.executor.sandbox import Confinement
from execgate.executor.sandbox.registry import Sandboxes
from tests.cancel_support import at, detail, in_order, new_tag, phases, sh, tagged
from tests.daemon import Daemon
from tests.support import Streamer, wait_until

POLICIES = Path(__file__).resolve().parents[2] / "policies"
HEAD = "version: 1\nrules:\n  - {id: all, effect: allow, tools: ['*']}\n"


def with_limits(entries: str) -> str:
    return HEAD + "limits:\n" + entries


def refused(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    return info.value


# ---------------------------------------------------------------- loading `limits:`

# BUG at 1ae131b (executor/policy/runrules.py, limit_rule): `values` runs _positive over
# every LIMIT_KEYS key the entry has, `tools` and `agents` included, so every entry is
# refused ("limits[0].tools: must be a positive number") and no file with a `limits:`
# section loads. Every test here that loads one fails until limit_rule checks only
# timeout_s, grace_s and output_cap_kb.


# Each entry is line 5 of the file (line 6 for a second entry).
@pytest.mark.parametrize(
    ("entries", "where", "says"),
    [
        ("  - {tools: [x], timeout_s: 1, colour: red}\n", "5:32",
         "limits[0]: unknown key 'colour'"),
        ("  - {tools: [x], timeout_s: 0}\n", "5:29", "limits[0].timeout_s: must be a positive"),
        ("  - {tools: [x], timeout_s: true}\n", "5:29", "limits[0].timeout_s: must be a positive"),
        ("  - {tools: [x], timeout_s: soon}\n", "5:29", "limits[0].timeout_s: must be a positive"),
        ("  - {tools: [x], grace_s: -1}\n", "5:27", "limits[0].grace_s: must be a positive"),
        ("  - {tools: [x], grace_s: .nan}\n", "5:27", "limits[0].grace_s: must be a positive"),
        ("  - {tools: [x], output_cap_kb: .inf}\n", "5:33",
         "limits[0].output_cap_kb: must be a number from 1 to"),
        ("  - {tools: [x]}\n", "5:5", "limits[0]: sets no limit"),
        ("  - {tools: [x], agents: [bot]}\n", "5:5", "limits[0]: sets no limit"),
        ("  - {timeout_s: 1}\n", "5:5", "limits[0].tools: required"),
        ("  - {tools: x, timeout_s: 1}\n", "5:13", "limits[0].tools: must be a list"),
        ("  - {tools: [x], agents: bot, timeout_s: 1}\n", "5:26",
         "limits[0].agents: must be a list"),
        ("  - {tools: [x], timeout_s: 1}\n  - {tools: [y], grace_s: 0}\n", "6:27",
         "limits[1].grace_s: must be a positive"),
        ("  tools: [x]\n", "5:3", "limits: must be a list"),
    ],
)  # fmt: skip
def test_a_bad_limits_entry_is_refused_naming_file_line_column_and_field(
    entries: str, where: str, says: str
) -> None:
    err = refused(with_limits(entries))
    assert f"p.yaml:{where}: {says}" in str(err), str(err)


def test_limits_entries_load_in_seconds_and_bytes() -> None:
    policy = parse_policy(
        with_limits(
            "  - {tools: [run_command], timeout_s: 30, grace_s: 0.5}\n"
            "  - {tools: ['*'], agents: [bot, 'group:slow'], output_cap_kb: 1.5}\n"
        ),
        "p.yaml",
    )
    [first, second] = policy.limits
    assert first.limits == CallLimits(timeout=30.0, grace=0.5, output_cap=None)
    assert (first.scope.tools, first.scope.agents) == (("run_command",), ())
    assert second.limits == CallLimits(output_cap=1536)
    assert second.scope.agents == ("bot", "group:slow")


def test_the_schema_accepts_limits_and_membership_entries() -> None:
    schema = json.loads((POLICIES / "policy.schema.json").read_text())
    doc = yaml.safe_load(SCOPED)
    jsonschema.validate(doc, schema)
    doc["limits"][0]["colour"] = "red"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


# ---------------------------------------------------------------- tightest wins (property)

TOOLS = ("read_file", "run_command", "search")
TOOL_GLOBS = ("*", "run_*", "read_file", "*_file", "search")
AGENTS = ("bot", "carol", "ci-7")
AGENT_ENTRIES = ("bot", "c*", "ci-*", "*", "group:builders", "group:ops", "role:operator")
MEMBERSHIPS = ("group:builders", "group:ops", "role:agent", "role:operator")
LIMITS = ("timeout_s", "grace_s", "output_cap_kb")
# Within every one of LIMITS' ranges (executor/core/ranges.py; output_cap_kb starts at 1).
NUMBERS = st.one_of(
    st.integers(min_value=1, max_value=600),
    st.sampled_from([1.0, 1.5, 2.25, 30.0, 599.5]),
)


@st.composite
def limit_entries(draw: st.DrawFn) -> list[dict[str, Any]]:
    entries = []
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        entry: dict[str, Any] = {
            "tools": draw(st.lists(st.sampled_from(TOOL_GLOBS), min_size=1, max_size=2))
        }
        agents = draw(st.lists(st.sampled_from(AGENT_ENTRIES), max_size=2))
        if agents:
            entry["agents"] = agents
        names = draw(st.lists(st.sampled_from(LIMITS), min_size=1, max_size=3, unique=True))
        entry.update({name: draw(NUMBERS) for name in names})
        entries.append(entry)
    return entries


def _oracle(entries: list[dict[str, Any]], call: PolicyInput) -> CallLimits:
    """What runrules' docstring says: every entry whose tools and agents cover the call
    applies, and per limit the smallest value wins. An agents entry is a name glob, or
    `group:G` / `role:R` matched against the memberships."""

    def covers(entry: dict[str, Any]) -> bool:
        if not any(fnmatch.fnmatchcase(call.tool, g) for g in entry["tools"]):
            return False
        agents = entry.get("agents", [])
        return not agents or any(
            p in call.memberships
            if p.startswith(("group:", "role:"))
            else fnmatch.fnmatchcase(call.agent, p)
            for p in agents
        )

    def least(name: str) -> float | None:
        values = [e[name] for e in entries if name in e and covers(e)]
        return min(values) if values else None

    cap = least("output_cap_kb")
    return CallLimits(
        timeout=least("timeout_s"),
        grace=least("grace_s"),
        output_cap=int(cap * 1024) if cap is not None else None,
    )


@settings(max_examples=150, deadline=None)
@given(
    entries=limit_entries().flatmap(lambda es: st.tuples(st.just(es), st.permutations(es))),
    tool=st.sampled_from(TOOLS),
    agent=st.sampled_from(AGENTS),
    members=st.frozensets(st.sampled_from(MEMBERSHIPS)),
)
def test_the_tightest_value_of_each_limit_wins_in_any_entry_order(
    entries: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    tool: str,
    agent: str,
    members: frozenset[str],
) -> None:
    given_order, shuffled = entries
    call = PolicyInput(tool=tool, agent=agent, memberships=members)
    text = HEAD + yaml.safe_dump({"limits": given_order}) if given_order else HEAD
    got = parse_policy(text, "p.yaml").limits_for(call)
    assert got == _oracle(given_order, call)
    if shuffled:
        again = parse_policy(HEAD + yaml.safe_dump({"limits": shuffled}), "p.yaml")
        assert again.limits_for(call) == got


# ---------------------------------------------------------------- agents: names, groups, roles

SCOPED_RULES = textwrap.dedent(
    """\
    version: 1
    default: deny
    rules:
      - {id: reads, effect: allow, tools: [read_file]}
      - {id: builders-run, effect: allow, tools: [run_command], agents: ['group:builders', bot]}
      - id: ops-write
        effect: ask
        tools: [write_file]
        agents: ['role:operator']
        approvers: [approver, alice]
        ttl: 60
    """
)
SCOPED = SCOPED_RULES + textwrap.dedent(
    """\
    limits:
      - {tools: ['*'], timeout_s: 60}
      - {tools: [run_command], agents: ['ci-*'], timeout_s: 30}
      - {tools: [run_command], agents: ['group:untrusted'], timeout_s: 5, output_cap_kb: 4}
      - {tools: [run_command], agents: ['role:operator'], grace_s: 0.5}
    """
)


@pytest.mark.parametrize(
    ("tool", "agent", "groups", "roles", "expected"),
    [
        ("run_command", "bob", (), (), CallLimits(timeout=60)),
        ("run_command", "ci-7", (), (), CallLimits(timeout=30)),
        ("run_command", "bob", ("untrusted",), (), CallLimits(timeout=5, output_cap=4096)),
        # Covered by a name glob and a group: the tighter timeout of the two.
        ("run_command", "ci-7", ("untrusted",), (), CallLimits(timeout=5, output_cap=4096)),
        ("run_command", "olga", (), ("operator",), CallLimits(timeout=60, grace=0.5)),
        ("read_file", "bob", ("untrusted",), ("operator",), CallLimits(timeout=60)),
        # A name is only a name: it cannot stand in for a group or a role.
        ("run_command", "group:untrusted", (), (), CallLimits(timeout=60)),
        ("run_command", "role:operator", (), (), CallLimits(timeout=60)),
        # The prefix matters: a role called `untrusted` is not the group.
        ("run_command", "bob", (), ("untrusted",), CallLimits(timeout=60)),
    ],
)
def test_limits_are_scoped_by_name_glob_group_and_role(
    tool: str, agent: str, groups: tuple[str, ...], roles: tuple[str, ...], expected: CallLimits
) -> None:
    policy = parse_policy(SCOPED, "p.yaml")
    call = PolicyInput(tool=tool, agent=agent, memberships=memberships(groups, roles))
    assert policy.limits_for(call) == expected


def test_no_limits_section_sets_nothing() -> None:
    policy = parse_policy(HEAD, "p.yaml")
    assert policy.limits_for(PolicyInput(tool="run_command", agent="bot")) == CallLimits()


@pytest.mark.parametrize(
    ("tool", "agent", "members", "effect", "rule_ids"),
    [
        ("run_command", "carol", {"group:builders"}, Effect.ALLOW, ("builders-run",)),
        ("run_command", "bot", set(), Effect.ALLOW, ("builders-run",)),
        ("run_command", "carol", set(), Effect.DENY, ()),
        ("run_command", "carol", {"group:ops", "role:builders"}, Effect.DENY, ()),
        # The spoof: a caller named like the entry, without the membership.
        ("run_command", "group:builders", set(), Effect.DENY, ()),
        ("write_file", "olga", {"role:operator"}, Effect.ASK, ("ops-write",)),
        ("write_file", "role:operator", set(), Effect.DENY, ()),
    ],
)
def test_a_rules_agents_entry_matches_a_name_a_group_member_or_a_role_holder(
    tool: str, agent: str, members: set[str], effect: Effect, rule_ids: tuple[str, ...]
) -> None:
    policy = parse_policy(SCOPED_RULES, "p.yaml")
    call = PolicyInput(tool=tool, agent=agent, memberships=frozenset(members))
    decision = policy.decide(call)
    assert (decision.effect, decision.rule_ids) == (effect, rule_ids)


def test_group_and_role_entries_are_matched_exactly_not_as_globs() -> None:
    assert agent_matches(("group:build*",), "bot", frozenset({"group:builders"})) is False
    assert agent_matches(("group:builders",), "bot", frozenset({"group:builders"})) is True
    assert agent_matches(("role:agent",), "bot", frozenset({"group:agent"})) is False
    assert agent_matches((), "anyone", frozenset()) is True
    assert memberships(["a", "b"], ["agent"]) == {"group:a", "group:b", "role:agent"}


def test_identity_names_and_groups_cannot_carry_a_colon() -> None:
    # What makes a plain-name entry unspoofable: no identity can be named `group:x`.
    template = (
        "version: 1\nidentities:\n  - name: {name}\n    roles: [agent]\n"
        f"    token_sha256: {hash_token('t' * 40)}\n"
        "    groups: [{group}]\n"
    )
    with pytest.raises(IdentityError, match=r"ids\.yaml:3:11: identities\[0\]\.name: .*not a name"):
        parse_identities(template.format(name="'group:builders'", group="x"), "ids.yaml")
    with pytest.raises(IdentityError, match=r"ids\.yaml:6:14: identities\[0\]\.groups\[0\]"):
        parse_identities(template.format(name="bot", group="'a:b'"), "ids.yaml")
    ids = parse_identities(template.format(name="bot", group="builders"), "ids.yaml")
    assert ids.memberships("bot") == {"group:builders", "role:agent"}
    assert ids.memberships("stranger") == frozenset()


EXAMPLES = textwrap.dedent(
    """\
    version: 1
    rules:
      - id: builders-run
        effect: allow
        tools: [run_command]
        agents: ['group:builders', 'role:admin']
        examples:
          match:
            - {tool: run_command, agent: bob, groups: [builders]}
            - {tool: run_command, agent: root, roles: [admin]}
          not_match:
            - {tool: run_command, agent: bob}
            - {tool: run_command, agent: 'group:builders'}
            - {tool: run_command, agent: bob, roles: [builders], groups: [admin]}
    """
)


def test_rule_examples_take_groups_and_roles() -> None:
    assert [r.id for r in parse_policy(EXAMPLES, "p.yaml").rules] == ["builders-run"]
    # The same member as a not_match example: the file is refused at that example.
    wrong = EXAMPLES + "        - {tool: run_command, agent: bob, groups: [builders]}\n"
    err = refused(wrong)
    assert "p.yaml:15:11: rules[0].examples.not_match[3]" in str(err), str(err)
    err = refused(EXAMPLES.replace("groups: [builders]}", "groups: builders}", 1))
    assert "p.yaml:9:51: rules[0].examples.match[0].groups: must be a list" in str(err), str(err)


# ---------------------------------------------------------------- the policy CLI


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["policy", *argv])
    return code, capsys.readouterr().out


def test_policy_test_cases_take_groups_and_roles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "scoped.yaml").write_text(SCOPED_RULES)
    run, write = {"tool": "run_command", "agent": "x"}, {"tool": "write_file", "agent": "o"}
    cases = [
        {"name": "a builder", "input": {**run, "groups": ["builders"]},
         "expect": "allow", "rules": ["builders-run"]},
        {"name": "not a builder", "input": run, "expect": "deny"},
        {"name": "an operator", "input": {**write, "roles": ["operator"]},
         "expect": "ask", "rules": ["ops-write"]},
        {"name": "wrong on purpose", "input": write, "expect": "ask"},
    ]  # fmt: skip
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "scoped_test.yaml").write_text(
        yaml.safe_dump({"policy": "../scoped.yaml", "cases": cases})
    )
    code, out = cli(capsys, "test", str(tests))
    assert code == 1, out
    assert "ok   a builder: allow" in out
    assert "ok   not a builder: deny" in out
    assert "ok   an operator: ask" in out
    assert "FAIL wrong on purpose: expected ask, got deny (default)" in out
    assert "3 passed, 1 failed" in out


def test_policy_explain_takes_groups_and_roles_and_names_the_approvers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "p.yaml"
    # No limits section: what the daemon would use is its own default.
    policy.write_text(SCOPED_RULES)
    base = ("explain", "--policy", str(policy), "--agent", "olga")
    code, out = cli(capsys, *base, "--tool", "write_file", "--role", "operator")
    assert code == 0, out
    assert out.splitlines()[0].startswith("decision: ask (ops-write)"), out
    assert "approval: needed from approver, alice, expires after 60s" in out
    assert "runs with: sandbox default, network False, timeout_s daemon default" in out
    code, out = cli(capsys, *base, "--tool", "run_command", "--group", "builders")
    assert out.splitlines()[0].startswith("decision: allow (builders-run)"), out
    assert "approval:" not in out
    code, out = cli(capsys, *base, "--tool", "run_command")
    assert out.splitlines()[0].startswith("decision: deny"), out
    assert "  builders-run (allow) does not match: agents" in out


def test_policy_explain_shows_the_limits_the_call_would_run_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(SCOPED)
    base = ("explain", "--policy", str(policy), "--tool", "run_command", "--agent", "ci-7")
    code, out = cli(capsys, *base, "--group", "untrusted", "--role", "operator")
    assert code == 1, out  # denied (no rule allows it): exit 1, and still the limits
    assert (
        "runs with: sandbox default, network False, timeout_s 5.0, grace_s 0.5, "
        "output_cap_bytes 4096"
    ) in out
    code, out = cli(capsys, *base, "--json")
    runs = json.loads(out)["runs_with"]
    assert (runs["timeout_s"], runs["grace_s"]) == (30.0, "daemon default")


# ---------------------------------------------------------------- sandbox rules with agents


class Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_the_first_sandbox_rule_covering_tool_and_agent_decides() -> None:
    policy = parse_policy(
        HEAD
        + "sandbox:\n"
        + "  - {tools: [run_command], agents: ['group:untrusted'], backend: docker}\n"
        + "  - {tools: [run_command], agents: ['ci-*'], backend: process, network: true}\n"
        + "  - {tools: ['run_*'], backend: bwrap, limits: {processes: 8}}\n",
        "p.yaml",
    )
    backends: dict[str, Any] = {n: Named(n) for n in ("bwrap", "process", "docker")}
    base = Confinement()
    boxes = Sandboxes(backends, "process", policy.sandbox_for, base)
    untrusted = frozenset({"group:untrusted"})

    box, conf = boxes.for_call("run_command", "bob", untrusted)
    assert (box.name, conf.network) == ("docker", False)
    # ci-7 is covered by the second rule too, but the first one decides.
    assert boxes.for_call("run_command", "ci-7", untrusted)[0].name == "docker"
    box, conf = boxes.for_call("run_command", "ci-7")
    assert (box.name, conf.network) == ("process", True)
    box, conf = boxes.for_call("run_command", "bob")
    assert (box.name, conf.processes) == ("bwrap", 8)
    # A name shaped like the entry is not a member.
    assert boxes.for_call("run_command", "group:untrusted")[0].name == "bwrap"
    # Cached per (tool, agent, memberships): asking again in another order changes nothing.
    assert boxes.for_call("run_command", "bob", untrusted)[0].name == "docker"
    assert boxes.for_call("run_command", "bob")[0].name == "bwrap"
    assert boxes.for_call("read_file", "bob", untrusted) == (backends["process"], base)


def test_a_sandbox_rules_agents_must_be_a_list() -> None:
    err = refused(HEAD + "sandbox:\n  - {tools: [x], agents: bot}\n")
    assert "p.yaml:5:26: sandbox[0].agents: must be a list" in str(err), str(err)


# ---------------------------------------------------------------- through a real daemon

TOKENS = {name: f"{name}-" + name[0] * 40 for name in ("bot", "carol", "olga")}
BIG = 10 * 1024
IDENTITIES = f"""\
version: 1
identities:
  - name: bot
    roles: [agent]
    groups: [slow]
    token_sha256: {hash_token(TOKENS["bot"])}
  - name: carol
    roles: [agent]
    token_sha256: {hash_token(TOKENS["carol"])}
  - name: olga
    roles: [operator, approver]
    token_sha256: {hash_token(TOKENS["olga"])}
"""
RULES = """\
version: 1
default: deny
rules:
  - {id: files, effect: allow, tools: [read_file, write_file, list_dir]}
  - {id: secrets, effect: deny, tools: ['*'], paths: ['**/.env']}
  - id: slow-commands-ask
    effect: ask
    tools: [run_command]
    agents: ['group:slow']
    argv_prefix: [[touch]]
    approvers: [approver, olga]
  - {id: commands, effect: allow, tools: [run_command]}
"""
LIMITED = (
    RULES
    + "limits:\n"
    + "  - {tools: [run_command], agents: ['group:slow'], timeout_s: 0.5, grace_s: 0.3}\n"
    + "  - {tools: [read_file], agents: [bot], output_cap_kb: 1}\n"
    # Covers everyone: it must not loosen the tighter entries above.
    + "  - {tools: ['*'], timeout_s: 120, output_cap_kb: 512}\n"
)


def serve(root: Path, policy_text: str) -> Daemon:
    root.mkdir(parents=True, exist_ok=True)
    ids = root / "identities.yaml"
    ids.write_text(IDENTITIES)
    policy = root / "policy.yaml"
    policy.write_text(policy_text)
    home = root / "daemon"
    home.mkdir(exist_ok=True)
    d = Daemon(home, "--identities", str(ids), "--policy", str(policy), "--sandbox", "process")
    return d.start()


def stop(d: Daemon) -> None:
    if d.proc is not None and d.proc.poll() is None:
        assert d.stop() == 0


def as_(d: Daemon, who: str) -> Client:
    return Client(d.address, token=TOKENS[who])


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The daemon's own grace is its default (2 s); the policy gives bot's group 0.3 s."""
    d = serve(tmp_path_factory.mktemp("limits"), LIMITED)
    (d.workspace / "big.txt").write_text("x" * BIG)
    yield d
    stop(d)


def test_a_policy_timeout_caps_the_calls_it_covers(limited: Daemon) -> None:
    slow = Call(tool="run_command", arguments={"argv": ["sleep", "5"]}, call_id="t-bot", timeout=20)
    with as_(limited, "bot") as bot:
        o = bot.run(slow, run_id="limits-timeout")
    # run_command may write, so a command stopped midway is UNKNOWN_OUTCOME.
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "timeout"), o
    assert detail(o, "cancel_requested").startswith("timeout after 0.5s"), phases(o)
    in_order(o, "started", "cancel_requested", "signal_sent", "stopped", "finished")
    ran = at(o, "cancel_requested") - at(o, "started")
    assert 0.45 <= ran < 2.0, ran  # the policy's 0.5 s, not the call's 20 s
    with as_(limited, "carol") as carol:
        ok = carol.run(
            Call(tool="run_command", arguments={"argv": ["sleep", "0.7"]}, call_id="t-carol"),
            run_id="limits-timeout",
        )
    assert (ok.status, ok.error_class) == (Status.SUCCESS, "none"), ok
    assert ok.mark("cancel_requested") is None
    assert at(ok, "finished") - at(ok, "started") >= 0.7


def test_a_policy_output_cap_truncates_only_the_covered_agents_result(limited: Daemon) -> None:
    read = Call(tool="read_file", arguments={"path": "big.txt"})
    with as_(limited, "bot") as bot:
        capped = bot.run(read, run_id="limits-cap")
    assert capped.truncated, capped
    assert capped.status is Status.PARTIAL, capped
    assert 0 < capped.returned_bytes <= 1024
    assert capped.total_bytes == BIG
    assert len(capped.text.encode()) <= 1024
    with as_(limited, "carol") as carol:
        whole = carol.run(read, run_id="limits-cap")
    assert (whole.status, whole.truncated) == (Status.SUCCESS, False), whole
    assert whole.returned_bytes == whole.total_bytes == BIG
    assert whole.text == "x" * BIG


STUBBORN = "trap '' TERM; sleep 30"


def forced_after(d: Daemon, who: str, cid: str) -> float:
    """Cancel `who`'s command that ignores SIGTERM; the grace it got (signal to expiry)."""
    tag = new_tag()
    stream = Streamer(
        d.address, [sh(STUBBORN, cid, tag=tag, timeout=40)], token=TOKENS[who], run_id="grace"
    )
    # The sleep runs once the trap is set: from then on SIGTERM is ignored.
    wait_until(lambda: tagged(tag, "sleep") or stream.error, f"{cid}'s sleep")
    assert stream.error is None, stream.error
    with as_(d, who) as c:
        assert c.cancel(call_id=cid, run_id="grace") == [cid]
    stream.join()
    o = stream.outcome(cid)
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled"), o
    assert o.stopped_how is StopMode.FORCE_TERMINATED, phases(o)
    in_order(o, "signal_sent", "grace_expired", "force_terminated", "stopped")
    wait_until(lambda: tagged(tag) == [], f"{cid}'s processes to be gone", timeout=5)
    return at(o, "grace_expired") - at(o, "signal_sent")


def test_a_policy_grace_period_replaces_the_daemons_for_the_calls_it_covers(
    limited: Daemon,
) -> None:
    policy_grace = forced_after(limited, "bot", "g-bot")
    assert 0.25 <= policy_grace < 1.5, policy_grace  # the policy's 0.3 s
    default_grace = forced_after(limited, "carol", "g-carol")
    assert 1.9 <= default_grace < 3.5, default_grace  # the daemon's 2 s


def events(d: Daemon) -> list[tuple[str, int, str]]:
    with sqlite3.connect(f"file:{d.state_dir / 'journal.db'}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT source, accepted, message FROM policy_events ORDER BY seq")
        return rows.fetchall()


def test_a_reloaded_limits_section_applies_to_the_next_call(tmp_path: Path) -> None:
    d = serve(tmp_path, RULES)
    try:
        (d.workspace / "big.txt").write_text("x" * BIG)
        read = Call(tool="read_file", arguments={"path": "big.txt"})
        with as_(d, "carol") as carol:
            assert carol.run(read).returned_bytes == BIG
            policy = tmp_path / "policy.yaml"
            fresh = policy.with_suffix(".new")
            fresh.write_text(RULES + "limits:\n  - {tools: [read_file], output_cap_kb: 2}\n")
            fresh.rename(policy)
            wait_until(lambda: events(d), "the new policy file to be looked at", timeout=10)
            [(source, accepted, message)] = events(d)
            assert (source, accepted) == (str(policy), 1), message
            after = carol.run(read)
        assert after.truncated, after
        assert 0 < after.returned_bytes <= 2048
    finally:
        stop(d)


# ---------------------------------------------------------------- Explain: the policy decision


@pytest.fixture(scope="module")
def explaining(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = serve(tmp_path_factory.mktemp("explain"), RULES)
    yield d
    stop(d)


def touch(call_id: str) -> Call:
    return Call(tool="run_command", arguments={"argv": ["touch", "x"]}, call_id=call_id)


def test_explain_returns_the_policy_decision_of_each_call(explaining: Daemon) -> None:
    batch = [
        Call(tool="read_file", arguments={"path": "a.txt"}, call_id="read"),
        touch("touch"),
        Call(tool="read_file", arguments={"path": "conf/.env"}, call_id="secret"),
        Call(tool="read_file", arguments={}, call_id="invalid"),
    ]
    with as_(explaining, "bot") as bot:
        read, ask, secret, invalid = bot.explain(batch, run_id="explain")
    assert read.policy is not None
    assert (read.policy.effect, read.policy.rule_ids) == ("allow", ("files",))
    assert (read.needs_approval, read.rejected) == (False, None)
    # An ask rule: nothing rejects it, it would wait for one of the approvers.
    assert ask.policy is not None
    assert (ask.policy.effect, ask.policy.rule_ids) == ("ask", ("slow-commands-ask",))
    assert ask.policy.approvers == ("approver", "olga")
    assert (ask.needs_approval, ask.rejected) == (True, None)
    assert secret.policy is not None
    assert (secret.policy.effect, secret.policy.rule_ids) == ("deny", ("secrets",))
    assert secret.needs_approval is False
    assert secret.rejected is not None
    assert (secret.rejected.status, secret.rejected.error_class) == (
        Status.REJECTED,
        "policy_denied",
    )
    # Validation refused it before any policy decision was made.
    assert invalid.rejected is not None
    assert invalid.policy is None
    assert read.policy.revision == ask.policy.revision != ""
    # Nothing ran: no call was journaled.
    with as_(explaining, "bot") as bot:
        assert bot.list_calls(run_id="explain") == []


def test_explain_decides_with_the_callers_groups(explaining: Daemon) -> None:
    # The ask rule names bot's group; carol is in none, so she is only allowed.
    with as_(explaining, "carol") as carol:
        [plan] = carol.explain([touch("touch")], run_id="explain")
    assert plan.policy is not None
    assert (plan.policy.effect, plan.policy.rule_ids) == ("allow", ("commands",))
    assert (plan.needs_approval, plan.policy.approvers) == (False, ())


def test_the_explain_cli_shows_who_must_approve(explaining: Daemon, tmp_path: Path) -> None:
    batch = tmp_path / "batch.json"
    batch.write_text(
        json.dumps(
            [
                {"tool": "run_command", "arguments": {"argv": ["touch", "x"]}, "call_id": "t1"},
                {"tool": "read_file", "arguments": {"path": "a.txt"}, "call_id": "r1"},
            ]
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("EXECGATE_ADDR", "EXECGATE_TOKEN")}
    env.update({"COLUMNS": "250", "NO_COLOR": "1"})
    argv = [sys.executable, "-m", "execgate.executor.cli", "explain", str(batch)]
    argv += ["--addr", explaining.address, "--token", TOKENS["bot"]]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, (result.stdout, result.stderr)
    # Tables have no outer edge: the call is the second cell ("#" is the first).
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert "ask (slow-commands-ask): needs approval from approver, olga" in rows["t1"], rows
    assert "allow (files)" in rows["r1"], rows
    assert "needs approval" not in rows["r1"]


def test_an_ask_call_really_parks_as_explain_said(explaining: Daemon) -> None:
    # What Explain reported is what Execute does: bot's touch waits for an approver.
    stream = Streamer(explaining.address, [touch("parked")], token=TOKENS["bot"], run_id="park")
    wait_until(
        lambda: stream.seen(EventKind.AWAITING_APPROVAL, "parked") or stream.error,
        "the call to be parked",
    )
    assert stream.error is None, stream.error
    event = next(e for e in stream.events if e.kind is EventKind.AWAITING_APPROVAL)
    assert event.rule_id == "slow-commands-ask"
    with as_(explaining, "olga") as olga:
        olga.deny(event.approval_id, "only a test")
    stream.join()
    outcome: Outcome = stream.outcome("parked")
    assert outcome.error_class == "approval_denied"
    assert not (explaining.workspace / "x").exists()
