"""The grant rule, shared by every backend: all or nothing, in fair order per conflict.

Waiters stand in *fair order* (`Turns`): each belongs to a flow (the calling
agent) and gets a tag, one more than its flow's last waiting tag but never less
than one more than the smallest tag waiting. So a flow's own waiters keep their
arrival order, and flows take turns: an agent that queued thousands of calls
holds the first places once each, not all of them (start-time fair queueing,
with the smallest waiting tag as the virtual time). With one flow this is
arrival (FIFO) order.

A waiter is granted when its plan is compatible with every lock held and with
the plan of every waiter before it in that order still waiting, and its flow
holds fewer grants than the waiter's cap (the agent's concurrent-call limit; 0:
none). So a call takes all its locks at once (nobody holds some while waiting
for others: no deadlock), conflicting calls are granted in fair order, and a
call that conflicts with nobody ahead of it starts at once, overtaking them.

No waiter starves: a new waiter's tag is above the smallest waiting one, so the
first waiter in the order is overtaken only by calls that do not conflict with
it, and is granted once the holders it conflicts with (and its flow's own
grants past the cap) are gone; then the next one is first, and so on.

Backends work on `Entries`, a plan flattened to (key parts, mode) pairs: the
key parts are plain tuples, which hash and compare in C, and this runs for
every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple, TypeVar

from .base import WaitInfo
from .keys import Key
from .modes import LockMode

T = TypeVar("T")

Parts = tuple[str, ...]
Entries = tuple[tuple[Parts, LockMode], ...]


def entries(plan: Mapping[Key, LockMode]) -> Entries:
    """A plan as the lock table reads it (also a private copy of the caller's mapping)."""
    return tuple([(key.parts, mode) for key, mode in plan.items()])


class LockTable:
    """The union of some plans, per key; answers "would this plan conflict?" fast."""

    __slots__ = ("_nodes",)

    def __init__(self, plans: Iterable[Entries] = ()) -> None:
        # Per key, one int holding a 32-bit count per mode (see LockMode.unit).
        # Invariant: no value is 0 (a key nobody holds is absent), so an empty
        # table is an empty dict.
        self._nodes: dict[Parts, int] = {}
        for items in plans:
            self.add(items)

    def __bool__(self) -> bool:
        return bool(self._nodes)

    def add(self, items: Entries) -> None:
        nodes = self._nodes
        for parts, mode in items:
            nodes[parts] = nodes.get(parts, 0) + mode.unit

    def remove(self, items: Entries) -> None:
        """Undo one earlier `add(items)`."""
        nodes = self._nodes
        for parts, mode in items:
            left = nodes[parts] - mode.unit
            if left:
                nodes[parts] = left
            else:
                del nodes[parts]

    def conflicts(self, items: Entries) -> bool:
        nodes = self._nodes
        if nodes:
            for parts, mode in items:
                if nodes.get(parts, 0) & mode.conflicts:
                    return True
        return False

    def modes(self, key: Key) -> frozenset[LockMode]:
        """The modes held on `key` (for tests and debugging)."""
        value = self._nodes.get(key.parts, 0)
        return frozenset(m for m in LockMode if value & (m.unit * 0xFFFFFFFF))


class Ask(NamedTuple):
    """One waiter as the rule sees it: its plan, its flow and that flow's cap."""

    items: Entries
    # Whose turn it is: the calling agent ("" for calls nobody is named for).
    flow: str = ""
    # At most this many grants of `flow` held at once; 0: no cap.
    cap: int = 0


def under_cap(ask: Ask, running: Mapping[str, int]) -> bool:
    """May `ask`'s flow hold one more grant?"""
    return not ask.cap or running.get(ask.flow, 0) < ask.cap


def admissible(items: Entries, held: LockTable, ahead: LockTable) -> bool:
    """The lock part of the rule for one waiter: no conflict with holders nor earlier waiters."""
    return not held.conflicts(items) and not ahead.conflicts(items)


def decide(held: LockTable, running: dict[str, int], queue: Iterable[tuple[T, Ask]]) -> list[T]:
    """Which waiters of `queue` (fair order) are granted now; adds their plans to `held`
    and counts them in `running` (grants held per flow).

    Granted waiters join `held` as the pass goes, so a later waiter is checked
    against them too; a waiter left waiting -- for a lock or for its cap -- blocks
    every later one it conflicts with.
    """
    ahead = LockTable()
    granted: list[T] = []
    for ident, ask in queue:
        items = ask.items
        if under_cap(ask, running) and admissible(items, held, ahead):
            held.add(items)
            running[ask.flow] = running.get(ask.flow, 0) + 1
            granted.append(ident)
        else:
            ahead.add(items)
    return granted


class Turns:
    """Tags of the waiting calls per flow: the fair order is (tag, arrival).

    Only flows with a waiter are kept (a flow whose waiters are all gone starts
    afresh), so the table is as large as the queue at most.
    """

    __slots__ = ("_flows",)

    def __init__(self) -> None:
        # flow -> [waiters it has, the last tag given to one of them]
        self._flows: dict[str, list[int]] = {}

    def next_tag(self, flow: str, smallest: int) -> int:
        """The tag the flow's next waiter gets; `smallest`: the smallest tag waiting (0: none)."""
        found = self._flows.get(flow)
        last = found[1] if found is not None else 0
        return max(last, smallest) + 1

    def join(self, flow: str, tag: int) -> None:
        found = self._flows.get(flow)
        if found is None:
            self._flows[flow] = [1, tag]
        else:
            found[0] += 1
            found[1] = max(found[1], tag)

    def waiting(self, flow: str) -> bool:
        """Has the flow a waiter?"""
        return flow in self._flows

    def leave(self, flow: str) -> None:
        found = self._flows[flow]
        found[0] -= 1
        if not found[0]:
            del self._flows[flow]


def wait_info(
    items: Entries,
    holders: Iterable[tuple[str, Entries]],
    earlier: Iterable[tuple[str, Entries]],
) -> WaitInfo:
    """The keys `items` conflicts on and the owners (holders, then earlier waiters) in its way."""
    hit: set[Parts] = set()
    owners: dict[str, None] = {}
    for group in (holders, earlier):
        for owner, other in group:
            theirs = dict(other)
            found = {
                p for p, m in items if (o := theirs.get(p)) is not None and m.conflicts & o.unit
            }
            if found:
                hit |= found
                owners[owner] = None
    return WaitInfo(tuple(Key(p) for p, _ in items if p in hit), tuple(owners))
