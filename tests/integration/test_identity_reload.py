"""Hot reload of the identities file through a real daemon: a removed identity or a
replaced token is refused from its next RPC on, a file that does not load is refused
(journaled with file:line:column) while the last good one stays in force, and a group
added to an identity applies to the policy decision of its next call.

Each test has its own daemon (it rewrites the file). Nothing sleeps: tests wait on
the daemon's answers and on `policy_events` rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execgate.client import Call, Client, Status, Unauthenticated
from execgate.executor.policy.identity import hash_token
from tests.daemon import Daemon
from tests.support import wait_until

TOKENS = {name: f"{name}-" + name[0] * 40 for name in ("bot", "carol")}
POLICY = """\
version: 1
default: deny
rules:
  - {id: reads, effect: allow, tools: [read_file, list_dir]}
  - {id: builders, effect: allow, tools: [write_file], agents: ['group:builders']}
"""


@dataclass(frozen=True)
class Person:
    name: str
    token: str
    roles: tuple[str, ...] = ("agent",)
    groups: tuple[str, ...] = ()


BOT = Person("bot", TOKENS["bot"])
CAROL = Person("carol", TOKENS["carol"])


def identities_text(*people: Person) -> str:
    lines = ["version: 1", "identities:"]
    for p in people:
        lines += [f"  - name: {p.name}", f"    roles: [{', '.join(p.roles)}]"]
        if p.groups:
            lines.append(f"    groups: [{', '.join(p.groups)}]")
        lines.append(f"    token_sha256: {hash_token(p.token)}")
    return "\n".join(lines) + "\n"


def save(path: Path, text: str) -> None:
    """As an editor saves: write a new file, rename it over the old one."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    fresh.rename(path)


@dataclass(frozen=True)
class Live:
    daemon: Daemon
    identities: Path

    def client(self, token: str) -> Client:
        return Client(self.daemon.address, token=token)

    def events(self) -> list[tuple[str, int, str]]:
        """(source, accepted, message) of every file the daemon reloaded or refused."""
        db = self.daemon.state_dir / "journal.db"
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT source, accepted, message FROM policy_events ORDER BY seq")
            return rows.fetchall()

    def next_event(self, seen: int) -> tuple[str, int, str]:
        """The first event after the `seen` ones; it must be about the identities file."""
        wait_until(lambda: len(self.events()) > seen, "the daemon to look at the file", 10)
        source, accepted, message = self.events()[seen]
        assert source == str(self.identities), (source, message)
        return source, accepted, message


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    identities = tmp_path / "identities.yaml"
    identities.write_text(identities_text(BOT, CAROL))
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    home = tmp_path / "d"
    home.mkdir()
    d = Daemon(
        home, "--identities", str(identities), "--policy", str(policy), "--sandbox", "process"
    ).start()
    (d.workspace / "a.txt").write_text("hello")
    try:
        yield Live(d, identities)
    finally:
        if d.proc is not None and d.proc.poll() is None:
            assert d.stop() == 0


def refused(c: Client) -> bool:
    try:
        c.list_tools()
    except Unauthenticated:
        return True
    return False


def reads(c: Client) -> bool:
    return c.run(Call(tool="read_file", arguments={"path": "a.txt"})).status is Status.SUCCESS


def test_a_removed_identity_is_refused_from_its_next_rpc(live: Live) -> None:
    # The clients (and their channels) outlive the reload: each RPC is judged anew.
    with live.client(TOKENS["bot"]) as bot, live.client(TOKENS["carol"]) as carol:
        assert reads(bot)
        assert reads(carol)
        save(live.identities, identities_text(BOT))
        wait_until(lambda: refused(carol), "carol to be refused", timeout=10)
        with pytest.raises(Unauthenticated):
            carol.run(Call(tool="read_file", arguments={"path": "a.txt"}))
        assert reads(bot)
    assert live.next_event(0)[1] == 1


def test_a_replaced_token_hash_refuses_the_old_token_and_admits_the_new(live: Live) -> None:
    new_token = "carol-new-" + "n" * 40
    with live.client(TOKENS["carol"]) as old, live.client(new_token) as new:
        assert reads(old)
        assert refused(new)
        save(live.identities, identities_text(BOT, Person("carol", new_token)))
        wait_until(lambda: refused(old), "carol's old token to be refused", timeout=10)
        o = new.run(Call(tool="read_file", arguments={"path": "a.txt"}, call_id="by-new-token"))
        assert o.status is Status.SUCCESS, o
        assert new.get_call("by-new-token").agent == "carol"
    with live.client(TOKENS["bot"]) as bot:
        assert reads(bot)


@pytest.mark.parametrize(
    ("broken", "says"),
    [
        (
            identities_text(BOT, CAROL).replace("roles: [agent]", "roles: [agnet]"),
            ":4:13: identities[0].roles[0]: unknown role 'agnet'",
        ),
        ("version: 1\nidentities: []\n", ":2:13: identities: lists nobody"),
        (identities_text(BOT, CAROL) + "  - name: [\n", ":10:1: not valid YAML"),
    ],
    ids=["unknown-role", "nobody", "not-yaml"],
)
def test_a_file_that_does_not_load_is_refused_and_the_last_good_one_stays(
    live: Live, broken: str, says: str
) -> None:
    save(live.identities, broken)
    _, accepted, message = live.next_event(0)
    assert accepted == 0
    assert f"{live.identities}{says}" in message, message
    # Fail closed, but not shut: everyone the last good file knew still gets in.
    with live.client(TOKENS["bot"]) as bot, live.client(TOKENS["carol"]) as carol:
        assert reads(bot)
        assert reads(carol)
        # The watcher goes on: a good file after the bad one is taken.
        save(live.identities, identities_text(BOT))
        assert live.next_event(1)[1] == 1
        assert refused(carol)
        assert reads(bot)
    assert "reload refused" in live.daemon.log()


def write(c: Client, name: str) -> Status:
    call = Call(tool="write_file", arguments={"path": name, "content": "x"}, call_id=name)
    return c.run(call).status


def test_a_group_added_to_an_identity_applies_to_its_next_call(live: Live) -> None:
    with live.client(TOKENS["bot"]) as bot, live.client(TOKENS["carol"]) as carol:
        assert write(bot, "before.txt") is Status.REJECTED
        save(
            live.identities,
            identities_text(Person("bot", TOKENS["bot"], groups=("builders",)), CAROL),
        )
        assert live.next_event(0)[1] == 1
        assert write(bot, "member.txt") is Status.SUCCESS
        record = bot.get_call("member.txt")
        assert record.policy is not None
        assert (record.agent, record.policy.rule_ids) == ("bot", ("builders",))
        assert (live.daemon.workspace / "member.txt").read_text() == "x"
        assert write(carol, "carol.txt") is Status.REJECTED
        # Taken away again: the memberships are replaced, not merged.
        save(live.identities, identities_text(BOT, CAROL))
        assert live.next_event(1)[1] == 1
        assert write(bot, "after.txt") is Status.REJECTED
    assert not (live.daemon.workspace / "after.txt").exists()
