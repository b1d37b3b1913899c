"""An MCP server's process is confined as the policy confines the agent that calls it:
the policy's sandbox rule for `net.*` opens the network to group `net` only, so two
agents calling the same server (`pool: daemon`) get two processes -- one in the
host's network, one in its own namespace that reaches nothing. An identities reload
that puts the second agent in the group gives its later calls the networked process,
and the process it no longer fits is closed.

The probe (`net_probe` of tests/fixtures/mcp/faulty_server.py) reports the network
namespace the server runs in and whether it could connect to a listener of the test's
on 127.0.0.1 (the host's loopback: reachable only from the host's namespace).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execgate.client import Client, Status
from execgate.executor.policy.identity import hash_token
from tests import mcp_support as ms
from tests.daemon import Daemon
from tests.probe_support import Listener, listeners

pytestmark = pytest.mark.timeout(240)

POLICY = """\
version: 1
default: deny
rules:
  - id: net-server
    effect: allow
    tools: ["net.*"]
    reason: the test's server
sandbox:
  - tools: ["net.*"]
    agents: ["group:net"]
    network: true
  - tools: ["net.*"]
    network: false
"""
TOKENS = {name: f"{name}-" + name[0] * 40 for name in ("bot", "bob", "olga")}
HOST_NETNS = os.readlink("/proc/self/ns/net")


def identities(path: Path, bob_groups: list[str]) -> None:
    """bot (group net) and bob (`bob_groups`) are agents; olga operates (ListProviders)."""
    people: list[tuple[str, str, list[str]]] = [
        ("bot", "agent", ["net"]),
        ("bob", "agent", bob_groups),
        ("olga", "operator", []),
    ]
    lines = ["version: 1", "identities:"]
    for name, role, groups in people:
        lines += [
            f"  - name: {name}",
            f"    roles: [{role}]",
            f"    token_sha256: {hash_token(TOKENS[name])}",
        ]
        if groups:
            lines.append(f"    groups: [{', '.join(groups)}]")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(path)


@pytest.fixture
def netlab(tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    tag = ms.new_tag()
    servers = [ms.entry("net", ms.fixture_server(), tag, trusted=True)]
    identities(tmp_path / "identities.yaml", bob_groups=[])
    extra = ("--identities", str(tmp_path / "identities.yaml"))
    daemon = ms.mcp_daemon(tmp_path, servers, POLICY, *extra).start(timeout=60)
    try:
        yield daemon, tag
    finally:
        daemon.stop()
    ms.wait_for(lambda: ms.tagged(tag) == [], 10, "the servers gone with the daemon")


def probe(daemon: Daemon, who: str, lst: Listener) -> dict[str, Any]:
    with Client(daemon.address, token=TOKENS[who]) as c:
        o = c.execute_one("net.net_probe", host=lst.host, port=lst.port)
    assert o.status is Status.SUCCESS, o
    found: dict[str, Any] = json.loads(o.text)
    return found


def running(daemon: Daemon) -> int:
    with Client(daemon.address, token=TOKENS["olga"]) as c:
        return ms.provider(c, "net").running


def test_each_agent_gets_the_network_its_rule_gives(netlab: tuple[Daemon, str]) -> None:
    daemon, tag = netlab
    ms.wait_for(lambda: ms.tagged(tag) == [], 10, "discovery's process closed")
    with listeners(["127.0.0.1"]) as [lst]:
        bot = probe(daemon, "bot", lst)
        assert (bot["netns"], bot["connect"]) == (HOST_NETNS, "ok"), bot
        bots = set(ms.tagged(tag))
        bob = probe(daemon, "bob", lst)
        assert bob["netns"] != HOST_NETNS, bob
        assert bob["connect"] != "ok", bob
        assert running(daemon) == 2, "one process per confinement, though `pool: daemon`"
        bobs = set(ms.tagged(tag)) - bots
        assert bobs, "bob's call runs in a process of its own"
        assert probe(daemon, "bot", lst)["connect"] == "ok", "bot's process is still bot's"

        identities(daemon.root / "identities.yaml", bob_groups=["net"])
        ms.wait_for(lambda: probe(daemon, "bob", lst)["connect"] == "ok", 20, "bob in group net")
        assert probe(daemon, "bob", lst)["netns"] == HOST_NETNS
        ms.wait_for(lambda: not set(ms.tagged(tag)) & bobs, 15, "bob's old process closed")
        assert set(ms.tagged(tag)) == bots, "bob now shares bot's process"
        assert running(daemon) == 1
    assert lst.received.count(b"hi\n") >= 3, lst.received


def test_pool_agent_gives_each_agent_a_process_of_its_own(tmp_path: Path) -> None:
    """`pool: agent`: each agent's calls share one process, never another agent's."""
    tag = ms.new_tag()
    servers = [ms.entry("mine", ms.fixture_server(), tag, pool="agent")]
    identities(tmp_path / "identities.yaml", bob_groups=[])
    policy = "version: 1\ndefault: deny\nrules:\n  - {id: mine, effect: allow, tools: [mine.*]}\n"
    extra = ("--identities", str(tmp_path / "identities.yaml"))
    daemon = ms.mcp_daemon(tmp_path, servers, policy, *extra).start(timeout=60)
    try:
        ms.wait_for(lambda: ms.tagged(tag) == [], 10, "discovery's process closed")
        seen: list[int] = []
        for who in ("bot", "bob", "bot", "bob"):
            with Client(daemon.address, token=TOKENS[who]) as c:
                o = c.execute_one("mine.echo", text=who)
            assert (o.status, o.text) == (Status.SUCCESS, who), o
            seen.append(len(ms.tagged(tag)))
        # bob's first call starts a second process (as many pids again), then no more.
        one = seen[0]
        assert one > 0
        assert seen == [one, 2 * one, 2 * one, 2 * one], seen
    finally:
        daemon.stop()
    ms.wait_for(lambda: ms.tagged(tag) == [], 10, "the servers gone with the daemon")
