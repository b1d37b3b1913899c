"""The policy's `quotas:` (per-agent limits): loading, combining, and the pipeline's
per-agent counts and rate (`pipeline/quota.py`) on a fake clock."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from execgate.executor.core.errors import PolicyError, ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.pipeline.quota import Quotas, Ticket
from execgate.executor.policy import Over, Quota, parse_policy
from execgate.executor.policy.quotas import NO_QUOTA
from tests.fakeclock import FakeClock

HEAD = """\
version: 1
default: deny
rules:
  - {id: all, effect: allow, tools: ["*"]}
"""


def policy(quotas: str) -> str:
    return HEAD + "quotas:\n" + textwrap.indent(textwrap.dedent(quotas), "  ")


POLICY = policy(
    """\
    - agents: ["*"]
      concurrent: 8
      per_second: 10
      queued: 100
    - agents: [group:interns, "ci-*"]
      concurrent: 2
      burst: 3
      per_second: 20
      over: reject
    """
)


def test_every_covering_entry_applies_and_the_smallest_value_wins() -> None:
    p = parse_policy(POLICY, "p.yaml")
    assert p.quota_for("nobody-special").concurrent is not None
    bob = p.quota_for("bob")
    assert (bob.cap, bob.queued and bob.queued.value, bob.bucket) == (8, 100, 10)
    intern = p.quota_for("x", frozenset({"group:interns"}))
    assert intern.concurrent is not None
    assert intern.per_second is not None
    # concurrent 2 from the interns' entry (with its `over: reject`), the rate 10 from
    # the first (smaller than 20, with its `wait`), burst 3 from the second.
    assert (intern.cap, intern.concurrent.field, intern.concurrent.over) == (
        2,
        "quotas[1].concurrent",
        Over.REJECT,
    )
    assert (intern.per_second.value, intern.per_second.field) == (10, "quotas[0].per_second")
    assert intern.per_second.over is Over.WAIT
    assert intern.bucket == 3
    assert parse_policy(HEAD, "p.yaml").quota_for("bob") == NO_QUOTA


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("- {concurrent: 0}", "quotas[0].concurrent: must be an integer from 1 to 10000"),
        ("- {concurrent: 2.5}", "quotas[0].concurrent: must be an integer from 1 to 10000"),
        ("- {concurrent: true}", "quotas[0].concurrent: must be an integer from 1 to 10000"),
        ("- {per_second: 0}", "quotas[0].per_second: must be a positive number"),
        ("- {per_second: .inf}", "quotas[0].per_second: must be a positive number"),
        ("- {per_second: .nan}", "quotas[0].per_second: must be a positive number"),
        ("- {queued: 2000000}", "quotas[0].queued: must be an integer from 1 to 1000000"),
        ("- {queued: 5, over: later}", "quotas[0].over: must be wait or reject"),
        ("- {burst: 3, queued: 5}", "quotas[0].burst: only with per_second"),
        ("- {agents: [bob]}", "quotas[0]: sets no limit (concurrent, per_second, queued)"),
        ("- {concurent: 3}", "quotas[0]: unknown key 'concurent'"),
    ],
)
def test_a_bad_entry_is_refused_at_file_line_naming_the_field(entry: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(policy(entry), "p.yaml")
    assert message in str(info.value)
    assert "p.yaml:6:" in str(info.value)  # the entry's line


# ---------------------------------------------------------------- pipeline/quota.py


def quota(text: str, agent: str = "bob") -> Quota:
    return parse_policy(policy(text), "p.yaml").quota_for(agent)


def refused(quotas: Quotas, agent: str, q: Quota) -> ToolError:
    with pytest.raises(ToolError) as info:
        quotas.admit(agent, q)
    err = info.value
    assert (err.status, err.error_class) == (Status.REJECTED, ErrorClass.RESOURCE_EXHAUSTED)
    return err


def test_queued_counts_the_agents_waiting_calls_only() -> None:
    q = quota("- {queued: 2}")
    quotas = Quotas()
    first, second = quotas.admit("bob", q), quotas.admit("bob", q)
    err = refused(quotas, "bob", q)
    assert err.field == "quotas[0].queued"
    assert "agent 'bob' has 2 calls waiting to start" in err.message
    assert "quotas[0].queued is 2" in err.message
    quotas.admit("alice", q).end()  # another agent has its own count
    first.start()  # running: no longer waiting
    third = quotas.admit("bob", q)
    assert quotas.counts("bob") == (2, 1)
    for ticket in (first, second, third):
        ticket.end()
        ticket.end()  # idempotent
    assert quotas.counts("bob") == (0, 0)
    assert not quotas._agents  # nothing kept for an agent with no call here


def test_concurrent_with_reject_refuses_a_call_that_would_wait_for_it() -> None:
    q = quota("- {concurrent: 2, over: reject}")
    quotas = Quotas()
    a, b = quotas.admit("bob", q), quotas.admit("bob", q)
    a.start()
    assert refused(quotas, "bob", q).field == "quotas[0].concurrent"
    a.end()
    quotas.admit("bob", q).end()
    b.end()
    # With `wait` the count is the lock manager's cap, not a refusal here.
    waiting = quota("- {concurrent: 1}")
    tickets = [quotas.admit("bob", waiting) for _ in range(3)]
    assert waiting.cap == 1
    for t in tickets:
        t.end()


def test_per_second_paces_calls_after_the_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    """10 per second, burst 3: three calls go at once, then one every 0.1 s, in order."""
    clock = FakeClock()
    q = quota("- {per_second: 10, burst: 3}")

    async def body() -> list[float]:
        quotas = Quotas(now=clock.monotonic)
        start = clock.monotonic()
        tickets = [quotas.admit("bob", q) for _ in range(6)]
        assert [round(t.delay, 3) for t in tickets] == [0, 0, 0, 0.1, 0.2, 0.3]
        done: list[float] = []

        async def one(t: Ticket) -> None:
            assert await t.pace(asyncio.Event())
            done.append(round(clock.monotonic() - start, 3))
            t.end()

        await asyncio.gather(*(one(t) for t in tickets))
        return done

    assert clock.run(body()) == [0, 0, 0, 0.1, 0.2, 0.3]


def test_per_second_with_reject_refuses_an_early_call() -> None:
    clock = FakeClock()
    q = quota("- {per_second: 2, over: reject}")
    quotas = Quotas(now=clock.monotonic)
    quotas.admit("bob", q).end()  # burst: ceil(2) = 2
    quotas.admit("bob", q).end()
    err = refused(quotas, "bob", q)
    assert err.field == "quotas[0].per_second"
    assert "faster than 2 per second" in err.message
    clock.advance(0.5)
    quotas.admit("bob", q).end()  # one slot again after 1/2 s


def test_pacing_gives_up_when_the_call_is_cancelled() -> None:
    clock = FakeClock()
    q = quota("- {per_second: 1}")

    async def body() -> bool:
        quotas = Quotas(now=clock.monotonic)
        quotas.admit("bob", q)
        late = quotas.admit("bob", q)
        assert late.delay == 1.0
        cancel = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, cancel.set)
        return await late.pace(cancel)

    assert clock.run(body()) is False
