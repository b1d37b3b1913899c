"""Idempotency keys: a retried call returns the recorded outcome instead of running twice.

The first call with a key owns it; a second call with the same key and the same
request either joins the in-flight owner or, once finished, gets the journaled
outcome. The same key with a different request is REJECTED
(idempotency_conflict). Keys are scoped to the calling agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Outcome, Status
from execgate.executor.journal.base import CallStore


@dataclass(frozen=True, slots=True)
class Replay:
    outcome: Outcome
    # The call that actually ran.
    call_id: str
    run_id: str


@dataclass(slots=True)
class _Owner:
    request_hash: str
    run_id: str
    call_id: str
    done: asyncio.Future[Replay]
    # False while the owner is still reading the journal: until then a different
    # request is not yet a conflict (the journal may hold an older owner).
    confirmed: bool = False


# Seconds between two looks at the journal while a call of another daemon holds a key,
# should the notice of its end be lost (a broken journal session): a fallback only.
REREAD = 5.0


class Idempotency:
    def __init__(self, journal: CallStore) -> None:
        self._journal = journal
        # Invariant: a key is here exactly while its owning call is unfinished.
        self._inflight: dict[tuple[str, str], _Owner] = {}
        # Calls waiting for a keyed call another daemon runs: one future per wait, here
        # only while it waits (`heard` resolves them).
        self._elsewhere: dict[tuple[str, str], set[asyncio.Future[None]]] = {}

    async def claim(
        self,
        agent: str,
        key: str,
        request_hash: str,
        run_id: str,
        call_id: str,
        on_join: Callable[[], None] | None = None,
    ) -> Replay | None:
        """None: the caller owns the key and must run, then `release`. Else: the replay.

        `on_join` is called just before waiting for an in-flight owner.
        """
        slot = (agent, key)
        while (owner := self._inflight.get(slot)) is not None:
            if owner.request_hash == request_hash:
                if on_join is not None:
                    on_join()
                return await asyncio.shield(owner.done)
            if owner.confirmed:
                check_hash(owner.request_hash, request_hash)
            # The journal may hold a recorded call that matches us: wait and look again.
            await asyncio.wait([owner.done])
        owner = _Owner(request_hash, run_id, call_id, asyncio.get_running_loop().create_future())
        self._inflight[slot] = owner  # claimed before any await: no second owner
        try:
            recorded = await self._journal.by_idempotency_key(agent, key)
            if recorded is None:
                owner.confirmed = True
                return None
            check_hash(recorded.request_hash, request_hash)
        except BaseException as exc:
            self._settle(slot, exc)
            raise
        if recorded.outcome is None:  # running on another daemon sharing the journal
            try:
                replay = await self.elsewhere(agent, key, request_hash)
            except BaseException as exc:
                self._settle(slot, exc)
                raise
        else:
            replay = Replay(recorded.outcome, recorded.call_id, recorded.run_id)
        self._settle(slot, replay)
        return replay

    async def elsewhere(self, agent: str, key: str, request_hash: str) -> Replay:
        """The outcome of the call holding `key` in the journal that runs on another
        daemon: waited for until that daemon records it (or, if it died, its reaper
        settles it UNKNOWN_OUTCOME). Woken by `heard`; re-reads every REREAD seconds."""
        slot = (agent, key)
        while True:
            heard: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waits = self._elsewhere.setdefault(slot, set())
            waits.add(heard)
            try:
                recorded = await self._journal.by_idempotency_key(agent, key)
                if recorded is None:  # never kept (its daemon's intent failed): unknown
                    return Replay(_unsettled(), "", "")
                check_hash(recorded.request_hash, request_hash)
                if recorded.outcome is not None:
                    return Replay(recorded.outcome, recorded.call_id, recorded.run_id)
                await asyncio.wait([heard], timeout=REREAD)
            finally:
                waits.discard(heard)
                if not waits:
                    self._elsewhere.pop(slot, None)

    def heard(self, agent: str, key: str) -> None:
        """Another daemon recorded the end of the call holding (agent, key)."""
        for waiter in self._elsewhere.get((agent, key), ()):
            if not waiter.done():
                waiter.set_result(None)

    def reread(self) -> None:
        """Notices may have been missed: every wait for another daemon's call looks again."""
        for agent, key in list(self._elsewhere):
            self.heard(agent, key)

    async def join_in_flight(
        self, agent: str, key: str, request_hash: str, run_id: str, call_id: str
    ) -> Replay | None:
        """The outcome of the running call `run_id/call_id` if it owns `key` for this request."""
        owner = self._inflight.get((agent, key))
        if owner is None or (owner.run_id, owner.call_id) != (run_id, call_id):
            return None
        if owner.request_hash != request_hash:
            return None
        return await asyncio.shield(owner.done)

    def release(self, agent: str, key: str, outcome: Outcome | BaseException) -> None:
        owner = self._inflight.get((agent, key))
        if owner is None:
            return
        result = (
            outcome
            if isinstance(outcome, BaseException)
            else Replay(outcome, owner.call_id, owner.run_id)
        )
        self._settle((agent, key), result)

    def _settle(self, slot: tuple[str, str], result: Replay | BaseException) -> None:
        owner = self._inflight.pop(slot)
        if isinstance(result, BaseException):
            owner.done.set_exception(result)
            owner.done.exception()  # mark retrieved: joiners are optional
        else:
            owner.done.set_result(result)


def check_hash(recorded_hash: str, request_hash: str) -> None:
    if recorded_hash != request_hash:
        raise ToolError(
            ErrorClass.IDEMPOTENCY_CONFLICT,
            "idempotency_key was already used with a different request",
            field="idempotency_key",
            status=Status.REJECTED,
        )


def _unsettled() -> Outcome:
    return Outcome(
        status=Status.UNKNOWN_OUTCOME,
        error_class=ErrorClass.INTERRUPTED,
        message="the call with this idempotency key has no recorded outcome yet",
    )
