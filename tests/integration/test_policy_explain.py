"""`execgate policy explain`: against the policy the daemon runs (the ExplainPolicy RPC)
unless given a file, the same answer either way, and exit 1 on deny.

Through real daemons and the real CLI in a subprocess: the daemon's policy differs from
the shipped one, so an answer from the wrong policy shows; a reload is followed; an
agent explains only its own calls, an operator anyone's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
