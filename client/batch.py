"""Matching a batch's outcomes (which arrive in completion order) back to its calls."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import replace

from .types import Call, Outcome


def with_ids(calls: Iterable[Call]) -> list[Call]:
    """Give every call without an id one, so its outcome can be found again."""
    return [c if c.call_id else replace(c, call_id="c_" + uuid.uuid4().hex[:20]) for c in calls]


def in_proposal_order(calls: list[Call], finished: list[Outcome]) -> list[Outcome]:
    """One outcome per call, in the order the calls were proposed.

    A call id used twice in one batch gets two outcomes from the daemon: the
    first occurrence takes the one that ran, later ones the duplicate_call_id
    rejections.
    """
    pending: dict[str, list[Outcome]] = {}
    for outcome in finished:
        pending.setdefault(outcome.call_id, []).append(outcome)
    for group in pending.values():
        group.sort(key=lambda o: o.error_class == "duplicate_call_id")
    result = []
    for call in calls:
        group = pending.get(call.call_id)
        if not group:
            raise RuntimeError(f"the daemon sent no outcome for call {call.call_id!r}")
        result.append(group.pop(0))
    return result
