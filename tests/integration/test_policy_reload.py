"""Hot reload through a real daemon: a valid change takes effect for the next call; an
invalid one is refused (journaled with file:line) and the last good policy stays."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from execgate.client import Call, Client, Status
from execgate.executor.policy import default_policy_path
from tests.daemon import Daemon
from tests.support import wait_until


def policy_text(*, deny_reads: bool = False, network: bool = False) -> str:
    doc = yaml.safe_load(default_policy_path().read_text())
    if deny_reads:
        doc["rules"].append(
            {"id": "no-reads", "effect": "deny", "tools": ["read_file"], "reason": "frozen"}
        )
    doc["sandbox"][0]["network"] = network
    return yaml.safe_dump(doc)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Daemon, Client, Path]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text())
    root = tmp_path / "d"
    root.mkdir()
    d = Daemon(root, "--policy", str(policy)).start()
    (d.workspace / "a.txt").write_text("hello")
    try:
        with Client(d.address) as c:
            yield d, c, policy
    finally:
        d.stop()


def read(c: Client) -> Status:
    return c.run(Call(tool="read_file", arguments={"path": "a.txt"})).status


def events(d: Daemon) -> list[tuple[int, str]]:
    with sqlite3.connect(f"file:{d.state_dir / 'journal.db'}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT accepted, message FROM policy_events ORDER BY seq").fetchall()


def replace(path: Path, text: str) -> None:
    """As an editor saves: write a new file, rename it over the old one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def test_a_valid_change_takes_effect_for_the_next_call(live: tuple[Daemon, Client, Path]) -> None:
    d, c, policy = live
    assert read(c) is Status.SUCCESS
    replace(policy, policy_text(deny_reads=True))
    wait_until(lambda: read(c) is Status.REJECTED, "the new rule to be in force", timeout=10)
    o = c.run(Call(tool="read_file", arguments={"path": "a.txt"}))
    assert (o.error_class, o.field) == ("policy_denied", "tool")
    assert "no-reads" in o.message
    assert events(d)[-1][0] == 1
    policy.write_text(policy_text())  # in place, this time
    wait_until(lambda: read(c) is Status.SUCCESS, "the rule to be gone again", timeout=10)


def test_an_invalid_file_is_refused_and_the_last_good_policy_stays(
    live: tuple[Daemon, Client, Path],
) -> None:
    d, c, policy = live
    replace(policy, policy_text(deny_reads=True))
    wait_until(lambda: read(c) is Status.REJECTED, "the deny rule", timeout=10)
    broken = policy_text(deny_reads=True).replace("reason: frozen", "reason: frozen\n  colour: red")
    replace(policy, broken)
    wait_until(lambda: any(not ok for ok, _ in events(d)), "the refusal to be journaled", 10)
    accepted, message = events(d)[-1]
    assert accepted == 0
    assert f"{policy}:" in message
    assert "unknown key 'colour'" in message
    line = next(i for i, t in enumerate(broken.splitlines(), 1) if "colour" in t)
    assert f"{policy}:{line}:" in message
    time.sleep(1.5)  # more checks than one: the refused file is not retried into force
    assert read(c) is Status.REJECTED  # fail closed: the last good policy, not none
    assert "reload refused" in d.log()


def test_a_changed_sandbox_section_waits_for_a_restart(live: tuple[Daemon, Client, Path]) -> None:
    d, c, policy = live
    replace(policy, policy_text(deny_reads=True, network=True))
    wait_until(lambda: len(events(d)) >= 1, "the file to be looked at", timeout=10)
    accepted, message = events(d)[-1]
    assert accepted == 0
    assert "sandbox" in message
    assert read(c) is Status.SUCCESS  # nothing of that file is in force


def test_every_call_records_its_decision_with_rules_and_revision(
    live: tuple[Daemon, Client, Path],
) -> None:
    d, c, policy = live
    (d.workspace / ".env").write_text("KEY=1")
    ok = c.run(Call(tool="read_file", arguments={"path": "a.txt"}, call_id="ok"))
    no = c.run(Call(tool="read_file", arguments={"path": ".env"}, call_id="no"))
    assert (ok.status, no.status) == (Status.SUCCESS, Status.REJECTED)
    revision = hashlib.sha256(policy.read_bytes()).hexdigest()
    allowed = c.get_call("ok").policy
    assert allowed is not None
    assert (allowed.effect, allowed.rule_ids, allowed.revision) == (
        "allow",
        ("workspace-reads",),
        revision,
    )
    denied = c.get_call("no").policy
    assert denied is not None
    assert (denied.effect, denied.rule_ids, denied.revision) == ("deny", ("secrets",), revision)


def test_shadow_rules_are_recorded_not_enforced(live: tuple[Daemon, Client, Path]) -> None:
    d, c, policy = live
    doc = yaml.safe_load(policy.read_text())
    doc["rules"].append(
        {"id": "maybe-no-reads", "effect": "deny", "mode": "shadow", "tools": ["read_file"]}
    )
    replace(policy, yaml.safe_dump(doc))
    wait_until(lambda: events(d) and events(d)[-1][0] == 1, "the shadow rule to load", 10)
    o = c.run(Call(tool="read_file", arguments={"path": "a.txt"}, call_id="shadowed"))
    assert o.status is Status.SUCCESS  # not enforced
    rec = c.get_call("shadowed").policy
    assert rec is not None
    assert rec.effect == "allow"
    assert rec.shadow == ("maybe-no-reads:deny",)
    assert "shadow rules maybe-no-reads:deny" in d.log()
