"""Running one turn's calls through the daemon, and reconciling calls whose fate the
loop did not see (a client that died mid-batch).

Every call carries a call id fixed by the loop before it is sent and an
idempotency key derived from it, so a call is never run twice: a resumed loop
first asks the journal (GetCall, once per call) what became of it, waits for one
still running or parked for an approval on the Execute stream (re-sent with its id
and key, it joins the call in flight; the daemon never asks for a second approval),
and re-sends only a call the daemon has no record of (it never got it) -- with
the same id and key, which the daemon would refuse or answer from its journal if
it had run after all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import CallNotFound, RequestError
from ..types import Call, Event, EventKind, Outcome, Status
from .record import Planned

if TYPE_CHECKING:  # the client package imports the loop: no cycle at run time
    from .._sync import Client


def to_call(run_id: str, p: Planned) -> Call:
    return Call(
        tool=p.tool,
        arguments=p.arguments,
        call_id=p.call_id,
        idempotency_key=f"{run_id}:{p.call_id}",
    )


def run_batch(
    client: Client,
    run_id: str,
    planned: Sequence[Planned],
    *,
    deadline: float | None,
    on_event: Callable[[Event], None],
) -> dict[str, Outcome]:
    """Execute the calls as one batch; their outcomes by call id."""
    outcomes: dict[str, Outcome] = {}
    calls = [to_call(run_id, p) for p in planned]
    for event in client.stream(calls, run_id=run_id, deadline=deadline):
        on_event(event)
        if event.kind is EventKind.FINISHED and event.outcome is not None:
            outcomes[event.call_id] = event.outcome
    return outcomes


def reconcile(
    client: Client,
    run_id: str,
    planned: Sequence[Planned],
    *,
    wait_s: float,
    deadline: float | None,
) -> dict[str, Outcome]:
    """What became of calls sent by a loop that died: the journal's outcome; a call still
    running or parked for an approval is waited for on the Execute stream (up to `wait_s`,
    then UNKNOWN_OUTCOME); a call the daemon never received is sent now, once."""
    outcomes: dict[str, Outcome] = {}
    unsent: list[Planned] = []
    joinable: list[Planned] = []
    # A call parked for approval has no journal row until decided, yet the daemon has it.
    parked = {a.call_id for a in client.approvals_of_run(run_id)}
    for p in planned:
        try:
            record = client.get_call(p.call_id, run_id=run_id)
        except CallNotFound:
            if p.call_id not in parked:
                unsent.append(p)
                continue
            record = None
        if record is not None and record.outcome is not None:
            outcomes[p.call_id] = record.outcome
        else:
            joinable.append(p)
    if joinable:
        outcomes.update(_join(client, run_id, joinable, wait_s))
    if unsent:
        outcomes.update(run_batch(client, run_id, unsent, deadline=deadline, on_event=_ignore))
    return outcomes


def _join(
    client: Client, run_id: str, planned: Sequence[Planned], wait_s: float
) -> dict[str, Outcome]:
    """Wait on the Execute stream for calls still running or parked for an approval: each
    is re-sent with its id and idempotency key, so it joins its in-flight owner (a parked
    one: the same approval, no second one) or, had it ended meanwhile, gets the journal's
    outcome -- it never runs twice. A call not settled within `wait_s` is UNKNOWN_OUTCOME;
    the wait stops nothing at the daemon."""
    seen: dict[str, Outcome] = {}
    calls = [to_call(run_id, p) for p in planned]
    try:
        for event in client.stream(calls, run_id=run_id, timeout=wait_s):
            if event.kind is EventKind.FINISHED and event.outcome is not None:
                seen[event.call_id] = event.outcome
    except RequestError as exc:
        if exc.code != "DEADLINE_EXCEEDED":
            raise
    outcomes: dict[str, Outcome] = {}
    for p in planned:
        found = seen.get(p.call_id)
        if found is not None and found.error_class == "duplicate_call_id":
            # Not joinable after all (the daemon could not match it to its owner): the
            # journal has the record; read once, never polled.
            found = _recorded(client, run_id, p.call_id)
        outcomes[p.call_id] = found or still_running(p.call_id, wait_s)
    return outcomes


def pending_calls(client: Client, run_id: str) -> list[str]:
    """The run's calls still running, or parked for an approval, at the daemon."""
    running = [c.call_id for c in client.runs.get(run_id).calls if c.running]
    parked = [a.call_id for a in client.approvals_of_run(run_id) if a.state.value == "pending"]
    return running + parked


def _recorded(client: Client, run_id: str, call_id: str) -> Outcome | None:
    try:
        return client.get_call(call_id, run_id=run_id).outcome
    except CallNotFound:
        return None


def still_running(call_id: str, waited: float) -> Outcome:
    return Outcome(
        call_id=call_id,
        status=Status.UNKNOWN_OUTCOME,
        error_class="timeout",
        message=(
            f"still running (or awaiting approval) at the daemon {waited:g}s after the run "
            "resumed; its effect is unknown until it ends (GetCall shows it then)"
        ),
    )


def _ignore(event: Event) -> None:
    return None
