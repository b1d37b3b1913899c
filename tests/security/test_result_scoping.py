"""Result scoping through a real daemon: an agent reads its own calls, runs and approvals;
an operator reads everyone's; the policy's `reads:` grants anything wider.

Two agents (alice, bob), an agent the policy lets read bob's records (carol), an
operator (olga) and an approver (abby). Another agent's call, run or approval is
answered exactly as one that does not exist (NOT_FOUND, the same message), never
with its raw result; lists leave it out.
"""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from execgate.client import Call, CallNotFound, Client, Status
from execgate.client.errors import RunNotFound
from execgate.v1 import executor_pb2 as pb
from tests.auth_support import Who, write_identities
from tests.daemon import Daemon
from tests.security.rawrpc import RawClient

TOKENS = {name: f"{name}-" + name[0] * 40 for name in ("alice", "bob", "carol", "olga", "abby")}
PEOPLE = [
    Who("alice", ("agent",), token=TOKENS["alice"]),
    Who("bob", ("agent",), token=TOKENS["bob"]),
    Who("carol", ("agent",), token=TOKENS["carol"]),
    Who("olga", ("operator",), token=TOKENS["olga"]),
    Who("abby", ("approver",), token=TOKENS["abby"]),
]
POLICY = textwrap.dedent(
    """\
    version: 1
    default: deny
    rules:
      - id: reads
        effect: allow
        tools: [read_file, noop]
      - id: ask-noop
        effect: ask
        tools: [noop]
        when: [{arg: echo, equals: ask-me}]
        approvers: [abby]
        ttl: 0.5
    reads:
      - agents: [carol]
        of: [bob]
    """
)
SECRET = "alice's secret " + uuid.uuid4().hex


@dataclass
class World:
    daemon: Daemon
    alice_call: str
    alice_run: str
    bob_call: str
    bob_run: str

    def client(self, who: str) -> Client:
        return Client(self.daemon.address, token=TOKENS[who])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root: Path = tmp_path_factory.mktemp("scoping")
    identities = write_identities(root / "identities.yaml", PEOPLE)
    (root / "policy.yaml").write_text(POLICY)
    daemon = Daemon(
        root, "--identities", str(identities), "--policy", str(root / "policy.yaml")
    ).start()
    (daemon.workspace / "secret.txt").write_text(SECRET)
    try:
        with Client(daemon.address, token=TOKENS["alice"]) as alice:
            run = alice.runs.start("alice's run")
            out = alice.run(Call(tool="read_file", arguments={"path": "secret.txt"}))
            assert out.status is Status.SUCCESS, out
            asked = alice.run(Call(tool="noop", arguments={"echo": "ask-me"}), run_id=run.run_id)
            assert asked.error_class == "approval_expired", asked
        with Client(daemon.address, token=TOKENS["bob"]) as bob:
            bob_run = bob.runs.start("bob's run")
            bob_out = bob.run(Call(tool="noop", arguments={"echo": "b"}), run_id=bob_run.run_id)
            assert bob_out.status is Status.SUCCESS, bob_out
        yield World(daemon, out.call_id, run.run_id, bob_out.call_id, bob_run.run_id)
    finally:
        daemon.stop()


def test_an_agent_reads_its_own_call_with_its_raw_result(world: World) -> None:
    with world.client("alice") as alice:
        record = alice.get_call(world.alice_call, include_raw=True)
    assert SECRET in record.raw_result


@pytest.mark.parametrize("who", ["bob", "carol"])
def test_another_agents_call_is_not_found(world: World, who: str) -> None:
    with world.client(who) as other:
        with pytest.raises(CallNotFound):
            other.get_call(world.alice_call, include_raw=True)
        with pytest.raises(CallNotFound):
            other.get_call(world.alice_call)


def test_not_found_says_the_same_as_for_a_call_that_does_not_exist(world: World) -> None:
    raw = RawClient(world.daemon.address, TOKENS["bob"])
    try:
        theirs = raw.call(
            "/execgate.v1.Executor/GetCall", pb.GetCallRequest(call_id=world.alice_call)
        )
        none = raw.call("/execgate.v1.Executor/GetCall", pb.GetCallRequest(call_id="c-nope"))
    finally:
        raw.close()
    assert theirs.code is none.code is grpc.StatusCode.NOT_FOUND
    assert theirs.details == none.details.replace("c-nope", world.alice_call)


def test_list_calls_holds_only_the_callers_own(world: World) -> None:
    with world.client("bob") as bob:
        mine = bob.list_calls(limit=1000)
        in_alices_run = bob.list_calls(run_id=world.alice_run)
    assert mine
    assert {r.agent for r in mine} == {"bob"}
    assert world.alice_call not in {r.call_id for r in mine}
    assert in_alices_run == []


def test_an_operator_reads_everyone(world: World) -> None:
    with world.client("olga") as olga:
        record = olga.get_call(world.alice_call, include_raw=True)
        agents = {r.agent for r in olga.list_calls(limit=1000)}
        runs = {r.run_id for r in olga.runs.find()}
        detail = olga.runs.get(world.alice_run)
        approvals = olga.approvals_of_run(world.alice_run)
    assert SECRET in record.raw_result
    assert {"alice", "bob"} <= agents
    assert {world.alice_run, world.bob_run} <= runs
    assert detail.run.owner == "alice"
    assert len(approvals) == 1


def test_the_policy_lets_carol_read_bobs_records_and_no_one_elses(world: World) -> None:
    with world.client("carol") as carol:
        record = carol.get_call(world.bob_call, run_id=world.bob_run)
        agents = {r.agent for r in carol.list_calls(limit=1000)}
        runs = {r.run_id for r in carol.runs.find()}
        detail = carol.runs.get(world.bob_run)
        with pytest.raises(RunNotFound):
            carol.runs.get(world.alice_run)
    assert record.agent == "bob"
    assert agents == {"bob"}
    assert world.bob_run in runs
    assert world.alice_run not in runs
    assert [c.call_id for c in detail.calls] == [world.bob_call]


def test_another_agents_run_is_not_found_and_not_listed(world: World) -> None:
    with world.client("bob") as bob:
        with pytest.raises(RunNotFound):
            bob.runs.get(world.alice_run)
        listed = {r.run_id for r in bob.runs.find()}
        by_owner = bob.runs.find(owner="alice")
        with pytest.raises(RunNotFound):
            list(bob.runs.watch(world.alice_run))
    assert listed == {world.bob_run}
    assert by_owner == []


def test_another_agents_approvals_are_not_listed(world: World) -> None:
    with world.client("alice") as alice:
        own = alice.approvals_of_run(world.alice_run)
    with world.client("bob") as bob:
        theirs = bob.approvals_of_run(world.alice_run)
    with world.client("abby") as abby:
        approver = abby.approvals_of_run(world.alice_run)
    assert [a.requester for a in own] == ["alice"]
    assert theirs == []
    assert len(approver) == 1  # approvers see what waits (ListPending); so its history
