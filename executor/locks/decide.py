"""The grant rule, shared by every backend: all or nothing, FIFO per conflict.

A waiter is granted when its plan is compatible with every lock held and with
the plan of every earlier waiter still waiting. So a call takes all its locks at
once (nobody holds some while waiting for others: no deadlock), conflicting
calls are granted in arrival order (no writer starves behind readers), and a
call that conflicts with nobody ahead of it starts at once, overtaking them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from .base import WaitInfo
from .keys import Key
from .modes import LockMode, conflict_keys

T = TypeVar("T")


class _Node:
    """The modes held on one key, counted so each release undoes exactly one grant."""

    __slots__ = ("counts", "mask")

    def __init__(self) -> None:
        # Invariant: bit m.bit of `mask` is set iff counts.get(m.bit, 0) > 0.
        self.mask = 0
        self.counts: dict[int, int] = {}


class LockTable:
    """The union of some plans, per key; answers "would this plan conflict?" fast."""

    __slots__ = ("_nodes",)

    def __init__(self, plans: Iterable[Mapping[Key, LockMode]] = ()) -> None:
        # Invariant: no node has an empty mask (a key nobody holds is absent).
        self._nodes: dict[Key, _Node] = {}
        for plan in plans:
            self.add(plan)

    def __bool__(self) -> bool:
        return bool(self._nodes)

    def add(self, plan: Mapping[Key, LockMode]) -> None:
        nodes = self._nodes
        for key, mode in plan.items():
            node = nodes.get(key)
            if node is None:
                node = nodes[key] = _Node()
            bit = mode.bit
            node.counts[bit] = node.counts.get(bit, 0) + 1
            node.mask |= bit

    def remove(self, plan: Mapping[Key, LockMode]) -> None:
        """Undo one earlier `add(plan)`."""
        nodes = self._nodes
        for key, mode in plan.items():
            node = nodes[key]
            bit = mode.bit
            left = node.counts[bit] - 1
            if left:
                node.counts[bit] = left
                continue
            del node.counts[bit]
            node.mask &= ~bit
            if not node.mask:
                del nodes[key]

    def conflicts(self, plan: Mapping[Key, LockMode]) -> bool:
        nodes = self._nodes
        if not nodes:
            return False
        for key, mode in plan.items():
            node = nodes.get(key)
            if node is not None and node.mask & mode.conflicts:
                return True
        return False

    def modes(self, key: Key) -> frozenset[LockMode]:
        """The modes held on `key` (for tests and debugging)."""
        node = self._nodes.get(key)
        if node is None:
            return frozenset()
        return frozenset(m for m in LockMode if node.mask & m.bit)


def admissible(plan: Mapping[Key, LockMode], held: LockTable, ahead: LockTable) -> bool:
    """The grant rule for one waiter: no conflict with holders nor earlier waiters."""
    return not held.conflicts(plan) and not ahead.conflicts(plan)


def decide(held: LockTable, queue: Iterable[tuple[T, Mapping[Key, LockMode]]]) -> list[T]:
    """Which waiters of `queue` (FIFO order) are granted now; adds their plans to `held`.

    Granted waiters join `held` as the pass goes, so a later waiter is checked
    against them too; a waiter left waiting blocks every later one it conflicts with.
    """
    ahead = LockTable()
    granted: list[T] = []
    for ident, plan in queue:
        if admissible(plan, held, ahead):
            held.add(plan)
            granted.append(ident)
        else:
            ahead.add(plan)
    return granted


def wait_info(
    plan: Mapping[Key, LockMode],
    holders: Iterable[tuple[str, Mapping[Key, LockMode]]],
    earlier: Iterable[tuple[str, Mapping[Key, LockMode]]],
) -> WaitInfo:
    """The keys `plan` conflicts on and the owners (holders, then earlier waiters) in its way."""
    keys: dict[Key, None] = {}
    owners: dict[str, None] = {}
    for group in (holders, earlier):
        for owner, other in group:
            hit = conflict_keys(plan, other)
            if hit:
                keys.update(dict.fromkeys(hit))
                owners[owner] = None
    ordered = tuple(k for k in plan if k in keys)
    return WaitInfo(ordered, tuple(owners))
