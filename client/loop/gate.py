"""The loop's own check of a model turn's calls, before any reaches the daemon.

Refused here (each becomes a `not_run` observation, one per call, with the others'
results): a tool the run does not offer, and a blind repeat of a call whose outcome
is unknown. A call that ended UNKNOWN_OUTCOME may or may not have had its effect;
repeating it unseen could do the thing twice. So the loop first asks the journal
again (GetCall: a call still running when a resumed loop gave up waiting may have
ended since), and otherwise refuses the identical call until the model has made
some other successful call since -- looked at the state, as the hint tells it to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import CallNotFound
from ..models.base import Turn
from ..types import Outcome, Status
from .observe import Refusal
from .record import Conversation, Planned, Refused
from .tally import canonical_arguments

if TYPE_CHECKING:  # the client package imports the loop: no cycle at run time
    from .._sync import Client


def check_calls(
    turn: Turn, offered: set[str], conv: Conversation, client: Client, run_id: str
) -> tuple[list[Planned], list[Refused]]:
    """The calls to send (ids fixed now: s<step>c<n>) and the ones refused."""
    planned: list[Planned] = []
    refused: list[Refused] = []
    step = conv.tally.steps
    for i, call in enumerate(turn.tool_calls):
        why, error_class = "", ""
        if call.name not in offered:
            why = f"{call.name!r} is not a tool offered: {', '.join(sorted(offered))}"
            error_class = Refusal.TOOL_NOT_OFFERED
        elif (earlier := _unreconciled(conv, call.name, call.arguments, client, run_id)) != "":
            why = (
                f"an identical earlier call ({earlier}) has an unknown outcome: check the "
                "state it would have changed before repeating it"
            )
            error_class = Refusal.REPEATED_CALL
        if why:
            refused.append(Refused(i, call.id, call.name, call.arguments, error_class, why))
        else:
            planned.append(Planned(f"s{step}c{i + 1}", i, call.id, call.name, call.arguments))
    return planned, refused


def _unreconciled(
    conv: Conversation, tool: str, arguments: dict[str, Any], client: Client, run_id: str
) -> str:
    """The id of the last identical call if its outcome is still unknown and nothing
    succeeded after it; "" when the call may go."""
    key = (tool, canonical_arguments(arguments))
    done = conv.done
    for i in range(len(done) - 1, -1, -1):
        planned, outcome = done[i]
        if (planned.tool, canonical_arguments(planned.arguments)) != key:
            continue
        if outcome.status is not Status.UNKNOWN_OUTCOME:
            return ""
        fresh = _journal_outcome(client, run_id, planned.call_id)
        if fresh is not None and fresh.status is not Status.UNKNOWN_OUTCOME:
            done[i] = (planned, fresh)
            return ""
        checked = any(o.status is Status.SUCCESS for _, o in done[i + 1 :])
        return "" if checked else planned.call_id
    return ""


def _journal_outcome(client: Client, run_id: str, call_id: str) -> Outcome | None:
    try:
        return client.get_call(call_id, run_id=run_id).outcome
    except CallNotFound:
        return None
