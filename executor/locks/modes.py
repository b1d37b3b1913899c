"""Lock modes of multi-granularity locking, and how a call's claims become a plan.

    IS   intends to read something below this node
    IX   intends to write something below this node
    S    reads this node and everything below it
    SIX  S, and intends to write something below
    X    writes this node and everything below it

A call names what it touches as claims (key, READ|WRITE). `plan` turns them into
the locks it must hold: S or X on each target, IS or IX on every ancestor, and one
combined mode per key. Two plans conflict exactly when some key carries modes that
are not compatible; the intention locks are what make "write dir/" meet "read
dir/a" at the node `dir`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from .keys import Key


class Mode(enum.Enum):
    """What a claim does to its key: reads it, or may change it."""

    READ = "read"
    WRITE = "write"


class LockMode(enum.Enum):
    IS = "IS"
    IX = "IX"
    S = "S"
    SIX = "SIX"
    X = "X"

    # The lock table keeps, per key, one int with a 32-bit count field per mode;
    # `unit` adds one to this mode's field, `conflicts` covers the fields of the
    # modes it is incompatible with: a request is checked against everything
    # held on a key with one `&`.
    unit: int
    conflicts: int


# The standard compatibility matrix (Gray et al.); symmetric.
_COMPATIBLE: dict[LockMode, frozenset[LockMode]] = {
    LockMode.IS: frozenset({LockMode.IS, LockMode.IX, LockMode.S, LockMode.SIX}),
    LockMode.IX: frozenset({LockMode.IS, LockMode.IX}),
    LockMode.S: frozenset({LockMode.IS, LockMode.S}),
    LockMode.SIX: frozenset({LockMode.IS}),
    LockMode.X: frozenset(),
}

# What each mode is at least as strong as (reflexive); `combine` picks the
# weakest mode that is at least as strong as both.
_COVERS: dict[LockMode, frozenset[LockMode]] = {
    LockMode.IS: frozenset({LockMode.IS}),
    LockMode.IX: frozenset({LockMode.IS, LockMode.IX}),
    LockMode.S: frozenset({LockMode.IS, LockMode.S}),
    LockMode.SIX: frozenset({LockMode.IS, LockMode.IX, LockMode.S, LockMode.SIX}),
    LockMode.X: frozenset(LockMode),
}
_BY_STRENGTH = (LockMode.IS, LockMode.IX, LockMode.S, LockMode.SIX, LockMode.X)

_FIELD = 32
for _i, _m in enumerate(LockMode):
    _m.unit = 1 << (_FIELD * _i)
for _m in LockMode:
    _m.conflicts = sum(o.unit * (2**_FIELD - 1) for o in LockMode if o not in _COMPATIBLE[_m])


def compatible(a: LockMode, b: LockMode) -> bool:
    """Whether two owners may hold `a` and `b` on the same key at the same time."""
    return b in _COMPATIBLE[a]


def _lub(a: LockMode, b: LockMode) -> LockMode:
    for m in _BY_STRENGTH:
        if a in _COVERS[m] and b in _COVERS[m]:
            return m
    raise AssertionError("X covers every mode")  # pragma: no cover


_COMBINED = {(a, b): _lub(a, b) for a in LockMode for b in LockMode}


def combine(a: LockMode, b: LockMode) -> LockMode:
    """The least upper bound: one mode that grants what `a` and `b` both need."""
    return _COMBINED[a, b]


class Claim(NamedTuple):
    """A call touches `key`: READ needs S on it, WRITE needs X.

    A NamedTuple rather than a dataclass: one is built per resource per call.
    """

    key: Key
    mode: Mode


Plan = Mapping[Key, LockMode]


def plan(claims: Iterable[Claim]) -> dict[Key, LockMode]:
    """Every lock the claims need: S/X on targets, IS/IX on ancestors, combined per key."""
    out: dict[Key, LockMode] = {}
    for key, mode in claims:
        if mode is Mode.WRITE:
            target, intent = LockMode.X, LockMode.IX
        else:
            target, intent = LockMode.S, LockMode.IS
        if not out:  # the common case, one claim: nothing to combine yet
            out = dict.fromkeys(key.ancestors(), intent)
            out[key] = target
            continue
        for ancestor in key.ancestors():
            _merge(out, ancestor, intent)
        _merge(out, key, target)
    return out


def _merge(out: dict[Key, LockMode], key: Key, mode: LockMode) -> None:
    held = out.get(key)
    out[key] = mode if held is None else _COMBINED[held, mode]


def plans_conflict(a: Plan, b: Plan) -> bool:
    """Whether two plans can not be held at the same time."""
    return bool(conflict_keys(a, b))


def conflict_keys(a: Plan, b: Plan) -> list[Key]:
    """The keys on which two plans hold incompatible modes, in `a`'s order."""
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    hits = {k for k, m in small.items() if (o := large.get(k)) is not None and m.conflicts & o.unit}
    return [k for k in a if k in hits]
