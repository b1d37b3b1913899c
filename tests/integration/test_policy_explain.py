"""`execgate policy explain`: against the policy the daemon runs (the ExplainPolicy RPC)
unless given a file, the same answer either way, and exit 1 on deny.

Through real daemons and the real CLI in a subprocess: the daemon's policy differs from
the shipped one, so an answer from the wrong policy shows; a reload is followed; an
agent explains only its own calls, an operator anyone's.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execgate.client import (
    AsyncClient,
    Client,
    PermissionDenied,
    PolicyDecision,
    RequestError,
    RuleVerdict,
)
from execgate.executor.cli.explain_remote import explanation
from execgate.executor.policy import PolicyInput, load_policy
from execgate.executor.policy.explain import Explanation, canonical
from execgate.executor.policy.explain import explain as explain_locally
from execgate.executor.policy.model import memberships
from tests.daemon import Daemon
from tests.support import wait_until

CLI = [sys.executable, "-m", "execgate.executor.cli", "policy", "explain"]

POLICY = """\
version: 1
default: deny
rules:
  - id: daemon-only-reads
    effect: allow
    tools: [read_file]
  - id: no-drafts
    effect: deny
    paths: ["drafts/"]
  - id: ops-ask
    effect: ask
    tools: [write_file]
    agents: ["group:ops"]
    approvers: [approver]
    ttl: 90
"""


def explain(daemon: Daemon | None, *args: str, token: str | None = None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EXECGATE_TOKEN", "EXECGATE_ADDR")}
    if daemon is not None:
        env["EXECGATE_ADDR"] = daemon.address
    if token is not None:
        env["EXECGATE_TOKEN"] = token
    proc = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    (tmp_path / "policy.yaml").write_text(POLICY)
    d = Daemon(tmp_path, "--policy", str(tmp_path / "policy.yaml")).start()
    try:
        yield d
    finally:
        d.stop()


def test_explains_against_the_daemons_policy_and_exits_1_on_deny(daemon: Daemon) -> None:
    code, out, err = explain(daemon, "--tool", "read_file", "--path", "notes/a.md")
    assert code == 0, err
    assert out.startswith("decision: allow (daemon-only-reads)"), out
    assert f"policy {daemon.root / 'policy.yaml'} revision" in out
    code, out, err = explain(daemon, "--tool", "read_file", "--path", "x/../drafts/b.md")
    assert code == 1, (out, err)
    assert out.startswith("decision: deny (no-drafts)"), out
    assert "  daemon-only-reads (allow) matches" in out
    # Not in this daemon's policy: the shipped default's rules never show.
    assert "workspace-reads" not in out


def test_ask_names_the_approvers_and_exits_0(daemon: Daemon) -> None:
    code, out, err = explain(daemon, "--tool", "write_file", "--group", "ops", "--agent", "bob")
    assert code == 0, err
    assert out.startswith("decision: ask (ops-ask)"), out
    assert "approval: needed from approver, expires after 90s" in out


def test_the_daemon_and_the_file_give_the_same_answer(daemon: Daemon) -> None:
    args = ("--tool", "write_file", "--agent", "bob", "--group", "ops", "--path", "a", "--json")
    code, remote, err = explain(daemon, *args)
    assert code == 0, err
    code, local, err = explain(None, "--policy", str(daemon.root / "policy.yaml"), *args)
    assert code == 0, err
    assert json.loads(remote) == json.loads(local)
    assert json.loads(remote)["each_rule"][1] == {
        "id": "no-drafts", "effect": "deny", "shadow": False, "not_matched_by": ["paths"],
    }  # fmt: skip


def test_follows_a_reload(daemon: Daemon) -> None:
    (daemon.root / "policy.yaml").write_text(
        POLICY.replace("tools: [read_file]", "tools: [list_dir]")
    )

    def reloaded() -> bool:
        return explain(daemon, "--tool", "read_file")[0] == 1

    wait_until(reloaded, "the reloaded policy explained")
    code, out, _ = explain(daemon, "--tool", "list_dir")
    assert (code, out.split(" (")[0]) == (0, "decision: allow")


def test_no_daemon_says_so_and_points_at_policy(tmp_path: Path) -> None:
    code, out, err = explain(None, "--tool", "read_file", "--addr", f"unix:{tmp_path}/none.sock")
    assert code == 69, (out, err)
    assert "none.sock" in err


def test_an_agent_explains_only_itself_an_operator_anyone(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    d = Daemon(tmp_path, "--policy", str(tmp_path / "policy.yaml"), "--local-identities").start()
    try:
        agent = (d.state_dir / "tokens/agent.token").read_text().strip()
        code, out, err = explain(d, "--tool", "read_file", token=agent)
        assert code == 0, err
        code, out, err = explain(d, "--tool", "write_file", "--agent", "agent", token=agent)
        assert code == 1, err  # itself, by name: its own (empty) groups
        code, out, err = explain(d, "--tool", "write_file", "--group", "ops", token=agent)
        assert code != 0
        assert "agent explains only its own calls" in err, err
        code, out, err = explain(d, "--tool", "read_file", "--agent", "operator", token=agent)
        assert "agent explains only its own calls" in err, err
        # No token given: the CLI uses make run's operator token, who may explain anyone.
        code, out, err = explain(d, "--tool", "write_file", "--agent", "bob", "--group", "ops")
        assert code == 0, err
        assert out.startswith("decision: ask (ops-ask)"), out
    finally:
        d.stop()


def test_bad_arguments_are_refused_naming_the_field(daemon: Daemon) -> None:
    code, _, err = explain(daemon, "--tool", "read_file", "--arg", "argv=1")
    assert code == 0, err  # a non-list argv is simply not a command
    code, _, err = explain(daemon, "--tool", "", "--path", "a")
    assert code != 0
    assert "tool: required" in err, err


# ---------------------------------------------------- Client.explain_policy, the same RPC

# POLICY with a `when:` rule (the arguments reach the daemon) and a shadow rule (its
# "rule:effect" form comes back).
ARGS_POLICY = (
    POLICY
    + """\
  - id: fast-lists
    effect: allow
    tools: [list_dir]
    when: [{arg: mode, equals: fast}]
  - id: watch-lists
    effect: deny
    mode: shadow
    tools: [list_dir]
"""
)


def local_answer(policy: Path, **call: Any) -> Explanation:
    """What `--policy FILE` computes for the same call (the CLI's local path)."""
    return explain_locally(
        load_policy(policy),
        PolicyInput(
            tool=call["tool"],
            agent=call["agent"],
            memberships=memberships(call.get("groups", ()), ()),
            paths=tuple(canonical(p) for p in call.get("paths", ())),
            args=call.get("args", {}),
        ),
    )


def test_the_client_carries_the_whole_answer(daemon: Daemon) -> None:
    policy = daemon.root / "policy.yaml"
    with Client(daemon.address) as eg:
        allowed = eg.explain_policy("read_file", paths=["notes/a.md"])
        denied = eg.explain_policy("read_file", paths=["x/../drafts/b.md"])
        asked = eg.explain_policy("write_file", agent="bob", groups=["ops"], paths=["a"])

    assert allowed.decision == PolicyDecision(
        "allow", ("daemon-only-reads",), allowed.decision.revision
    )
    assert allowed.decision.revision == load_policy(policy).revision
    assert allowed.effect == "allow"
    assert [(r.rule_id, r.effect, r.shadow, r.matches) for r in allowed.rules] == [
        ("daemon-only-reads", "allow", False, True),
        ("no-drafts", "deny", False, False),
        ("ops-ask", "ask", False, False),
    ]
    assert allowed.rules[1].not_matched_by == ("paths",)
    assert allowed.approval_ttl is None
    assert allowed.source == str(policy)
    assert set(allowed.runs_with) == {
        "sandbox",
        "network",
        "timeout_s",
        "grace_s",
        "output_cap_bytes",
    }

    # The path is folded as the daemon does: x/../drafts/b.md is drafts/b.md.
    assert (denied.effect, denied.decision.rule_ids) == ("deny", ("no-drafts",))
    assert denied.rules[1].matches

    assert (asked.effect, asked.decision.rule_ids) == ("ask", ("ops-ask",))
    assert asked.decision.approvers == ("approver",)
    assert asked.approval_ttl == 90.0
    # Field for field what the file gives (the converter the CLI prints through).
    assert explanation(asked) == local_answer(
        policy, tool="write_file", agent="bob", groups=["ops"], paths=["a"]
    )


def test_the_client_sends_the_arguments_and_gets_shadow_rules(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(ARGS_POLICY)
    d = Daemon(tmp_path, "--policy", str(tmp_path / "policy.yaml")).start()
    try:
        with Client(d.address) as eg:
            fast = eg.explain_policy("list_dir", agent="bob", arguments={"mode": "fast"})
            slow = eg.explain_policy("list_dir", agent="bob", arguments={"mode": "slow"})
            bare = eg.explain_policy("list_dir", agent="bob")
    finally:
        d.stop()
    assert (fast.effect, fast.decision.rule_ids) == ("allow", ("fast-lists",))
    assert fast.decision.shadow == ("watch-lists:deny",)
    assert fast.rules[-1] == RuleVerdict("watch-lists", "deny", True, ())
    assert (slow.effect, slow.decision.rule_ids) == ("deny", ())
    assert "when" in " ".join(slow.rules[3].not_matched_by), slow.rules[3]
    assert bare.effect == "deny"
    assert explanation(fast) == local_answer(
        tmp_path / "policy.yaml", tool="list_dir", agent="bob", args={"mode": "fast"}
    )


def test_the_client_raises_typed_errors_as_the_rpc_refuses(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    d = Daemon(tmp_path, "--policy", str(tmp_path / "policy.yaml"), "--local-identities").start()
    try:
        tokens = d.state_dir / "tokens"
        agent = (tokens / "agent.token").read_text().strip()
        operator = (tokens / "operator.token").read_text().strip()
        with Client(d.address, token=agent) as eg:
            assert eg.explain_policy("read_file").effect == "allow"
            # Itself by name: its own (empty) groups, so the ops rule does not ask.
            assert eg.explain_policy("write_file", agent="agent").effect == "deny"
            for others in ({"agent": "bob"}, {"groups": ["ops"]}, {"roles": ["admin"]}):
                with pytest.raises(PermissionDenied, match="agent explains only its own calls"):
                    eg.explain_policy("write_file", **others)
        with Client(d.address, token=operator) as eg:
            asked = eg.explain_policy("write_file", agent="bob", groups=["ops"])
            assert (asked.effect, asked.decision.approvers) == ("ask", ("approver",))
            with pytest.raises(RequestError, match="tool: required") as refused:
                eg.explain_policy("")
            assert refused.value.code == "INVALID_ARGUMENT"
            with pytest.raises(TypeError, match="paths: a list of strings"):
                eg.explain_policy("read_file", paths="notes/a.md")

        async def from_asyncio() -> None:
            async with AsyncClient(d.address, token=agent) as aeg:
                assert (await aeg.explain_policy("read_file")).effect == "allow"
                with pytest.raises(PermissionDenied):
                    await aeg.explain_policy("write_file", agent="bob")

        asyncio.run(from_asyncio())
    finally:
        d.stop()
