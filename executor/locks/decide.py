"""The grant rule, shared by every backend: all or nothing, FIFO per conflict.

A waiter is granted when its plan is compatible with every lock held and with
the plan of every earlier waiter still waiting. So a call takes all its locks at
once (nobody holds some while waiting for others: no deadlock), conflicting
calls are granted in arrival order (no writer starves behind readers), and a
call that conflicts with nobody ahead of it starts at once, overtaking them.

Backends work on `Entries`, a plan flattened to (key parts, mode) pairs: the
key parts are plain tuples, which hash and compare in C, and this runs for
every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

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


def admissible(items: Entries, held: LockTable, ahead: LockTable) -> bool:
    """The grant rule for one waiter: no conflict with holders nor earlier waiters."""
    return not held.conflicts(items) and not ahead.conflicts(items)


def decide(held: LockTable, queue: Iterable[tuple[T, Entries]]) -> list[T]:
    """Which waiters of `queue` (FIFO order) are granted now; adds their plans to `held`.

    Granted waiters join `held` as the pass goes, so a later waiter is checked
    against them too; a waiter left waiting blocks every later one it conflicts with.
    """
    ahead = LockTable()
    granted: list[T] = []
    for ident, items in queue:
        if admissible(items, held, ahead):
            held.add(items)
            granted.append(ident)
        else:
            ahead.add(items)
    return granted


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
