"""A loop step at the daemon (Runs.Step): the step's opening transitions, its batch
through the dispatcher, and the moves the daemon records for it.

    open      RunStore.open_step: the client's transitions (the last one enters
              running_tools), committed before any call of the batch is sent; a retried
              step's are recognised, not appended again
    batch     Dispatcher.execute, as for Execute; a retried step's calls join their
              calls in flight or are answered from the journal (ids and keys required)
    moves     while the batch runs: awaiting_approval and back (runs/steps.py), durably
    end       once every call has its outcome: the batch's end, committed before the step
              answers, fsync'd right after; nothing more of the run is recorded before
              that fsync -- so the whole step is on disk before the loop's next one starts

Nothing is recorded after a batch that did not end (the client went away, the daemon
stopped while a call awaited approval): the run stays where a resumed loop reconciles
its calls (docs/loop.md, Resume).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from execgate.executor.core.outcomes import Outcome
from execgate.executor.core.run import Run
from execgate.executor.core.runstate import Transition
from execgate.executor.runs import steps
from execgate.executor.runs.registry import Compose, RunStore
from execgate.executor.runs.syncs import Durability

from .calls import CallRequest
from .events import Event, EventKind


@dataclass(slots=True)
class StepMoves:
    """One step's moves after its opening, as one handler of it records or finds them."""

    store: RunStore
    run_id: str
    # Proposal order: the calls whose outcomes the batch's end lists.
    calls: Sequence[CallRequest]
    # The last seq this handler knows to be the step's (the opening's, at first).
    seen: int
    # The moves recorded for the step after its opening, in order.
    recorded: list[Transition] = field(default_factory=list)
    # The run after the last move recorded or found.
    run: Run | None = None
    # The step has ended (its end is recorded, by this handler or another).
    ended: bool = False
    # Calls parked for an approval, until they start or end.
    _parked: set[str] = field(default_factory=set)
    _outcomes: dict[int, Outcome] = field(default_factory=dict)

    async def on_event(self, event: Event) -> list[Transition]:
        """The moves a batch event makes (parking and unparking): recorded, returned."""
        match event.kind:
            case EventKind.AWAITING_APPROVAL if event.approval is not None:
                self._parked.add(event.call_id)
                a = event.approval
                return await self._move(
                    lambda state, seq: steps.parked(
                        self.run_id, state, seq, event.call_id, a.id, a.rule_id, a.reason
                    )
                )
            case EventKind.STARTED | EventKind.FINISHED:
                if event.outcome is not None:
                    self._outcomes[event.index] = event.outcome
                if event.call_id not in self._parked:
                    return []
                self._parked.discard(event.call_id)
                if self._parked:
                    return []
                how = event.kind.value
                return await self._move(
                    lambda state, seq: steps.unparked(self.run_id, state, seq, event.call_id, how)
                )
            case _:
                return []

    async def end(self) -> list[Transition]:
        """Every call has its outcome: the batch's end (and "approvals settled" first if
        the run still waits), committed before the step answers and fsync'd right after,
        before anything more of the run is recorded (Durability.SOON: the fsync runs
        while the loop asks its model); the moves returned."""
        results = [self._result(i, c) for i, c in enumerate(self.calls)]
        self._parked.clear()
        return await self._move(
            lambda state, seq: steps.closed(self.run_id, state, seq, results), Durability.SOON
        )

    def _result(self, i: int, call: CallRequest) -> steps.Result:
        outcome = self._outcomes[i]  # the batch ended: every call has one
        return steps.Result(call.call_id, outcome.status.value, outcome.error_class.value)

    async def _move(
        self, compose: Compose, durability: Durability = Durability.NOW
    ) -> list[Transition]:
        if self.ended:
            return []
        found = await self.store.step_move(self.run_id, self.seen, compose, durability)
        self.run, self.ended = found.run, found.ended
        if found.events:
            self.seen = found.events[-1].seq
            self.recorded.extend(found.events)
        return list(found.events)
