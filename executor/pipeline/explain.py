"""Explain: a batch's lock plan and policy decisions, computed as Execute would."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from execgate.executor.core.errors import ToolError
from execgate.executor.locks import explain as explain_plans
from execgate.executor.policy import PolicyInput

from . import results
from .authorize import Authorizer
from .calls import CallRequest, ValidCall
from .events import PlanRow
from .validate import Validator
from .workspaces import Workspaces


async def plan(
    calls: list[CallRequest],
    agent: str,
    validator: Validator,
    authorizer: Authorizer,
    confines: Callable[[ValidCall, PolicyInput], bool],
    workspaces: Workspaces,
) -> list[PlanRow]:
    """Each call validated (in the workspace Execute would choose) and decided (nothing
    runs, nothing is recorded), then who would wait for whom among the calls that would
    be scheduled. A command's declared paths are its plan only where its sandbox
    `confines` it to them, as in Execute."""
    rows: list[PlanRow] = []
    for req in calls:
        try:
            workspace, pinned = workspaces.choose(req, agent)
            call = await validator.validate(pinned, workspace)
        except ToolError as err:
            rows.append(PlanRow(req, None, results.from_error(err, ()), ()))
            continue
        decided_on = authorizer.input_for(call, agent)
        decision = authorizer.policy.decide(decided_on)
        try:
            authorizer.policy.enforce(decision)
        except ToolError as err:
            rows.append(PlanRow(req, None, results.from_error(err, ()), (), decision))
            continue
        placed = call.placed(call.effects.confined is None or confines(call, decided_on))
        rows.append(PlanRow(req, placed, None, (), decision))
    planned = [(r.request.call_id, r.call.lock_plan) for r in rows if r.call is not None]
    waits = dict(explain_plans(planned))
    return [replace(r, waits_for=waits.get(r.request.call_id, ())) for r in rows]
