"""Run: one scheduled call's tool, in its sandbox, with its limits and context, and the
outcome made of whatever the tool returned or raised."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from opentelemetry.trace import SpanContext

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Mark, Outcome, Phase, mark
from execgate.executor.core.paths import Workspace
from execgate.executor.policy import CallLimits, PolicyInput
from execgate.executor.sandbox import SandboxError
from execgate.executor.sandbox.registry import Placement, Sandboxes
from execgate.executor.tools import CancelScope, Limits, ToolContext

from . import results
from .authorize import Authorizer
from .calls import Approved, ValidCall

log = logging.getLogger("execgate.dispatch")

# A running call's progress report: (progress, total or None, message).
Progress = Callable[[float, float | None, str], None]


class Runner:
    """Runs approved calls' tools under the limits the policy in force sets for each."""

    def __init__(self, authorizer: Authorizer, sandboxes: Sandboxes, limits: Limits) -> None:
        self._authorizer = authorizer
        self._sandboxes = sandboxes
        self._limits = limits

    def confines(self, call: ValidCall, decided_on: PolicyInput) -> bool:
        """Does the sandbox this call will run in keep it to its declared writes?"""
        try:
            sandbox, _ = self._sandboxes.for_call(
                call.request.tool,
                decided_on.agent,
                decided_on.memberships,
                _declared_placement(call),
            )
        except SandboxError:
            return False  # run_tool reports the sandbox error; the locks stay wide
        return sandbox.confines_writes

    async def run(
        self,
        approved: Approved,
        deadline: float | None,
        scope: CancelScope,
        marks: tuple[Mark, ...],
        progress: Progress | None = None,
        trace: SpanContext | None = None,
        before_effect: Callable[[], None] | None = None,
    ) -> tuple[Outcome, str]:
        """The call's outcome (FINISHED marked) and raw result; `deadline`: its run's;
        `trace`: its batch span's context; `before_effect`: ToolContext's, when the
        call's intent is still being written."""
        authorized = approved.authorized
        set_by = self._authorizer.policy.limits_for(authorized.policy_input)
        limits, timeout = call_limits(self._limits, set_by, approved.valid, deadline)
        workspace = approved.valid.workspace
        return await run_tool(
            approved.valid,
            workspace=workspace,
            sandboxes=self._sandboxes,
            limits=limits,
            allowed_s=timeout,
            scope=scope,
            decided_on=authorized.policy_input,
            readable=self._authorizer.readable(authorized),
            hard_links=self._authorizer.hard_links(workspace),
            marks=marks,
            progress=progress,
            trace=trace,
            before_effect=before_effect,
        )


async def run_tool(
    call: ValidCall,
    *,
    workspace: Workspace,
    sandboxes: Sandboxes,
    limits: Limits,
    allowed_s: float,
    scope: CancelScope,
    decided_on: PolicyInput,
    readable: Callable[[Path], bool],
    hard_links: Callable[[Path], bool],
    marks: tuple[Mark, ...],
    progress: Progress | None = None,
    trace: SpanContext | None = None,
    before_effect: Callable[[], None] | None = None,
) -> tuple[Outcome, str]:
    """The tool's outcome (FINISHED marked) and its raw result for the journal.
    `allowed_s`: the call's timeout (its own, the policy's and the run's deadline)."""
    req = call.request
    try:
        sandbox, confinement = sandboxes.for_call(
            req.tool, decided_on.agent, decided_on.memberships, _declared_placement(call)
        )
    except SandboxError as exc:
        err = ToolError(ErrorClass.SANDBOX_ERROR, str(exc))
        return results.from_error(err, marks).with_marks(mark(Phase.FINISHED)), ""
    ctx = ToolContext(
        workspace,
        limits,
        allowed_s,
        scope,
        call.effects.detail,
        sandbox=sandbox,
        confinement=confinement,
        may_write=call.may_write,
        confined=call.effects.confined,
        marker=secrets.token_hex(8),
        run_id=req.run_id,
        agent=decided_on.agent,
        deadline=time.monotonic() + allowed_s,
        readable=readable,
        hard_links=hard_links,
        trace=trace,
        call_index=req.index,
    )
    if progress is not None:
        ctx.progress = progress
    if before_effect is not None:
        ctx.before_effect = before_effect
    try:
        out = await call.tool.run(call.args, ctx)
    except ToolError as err:
        return results.from_error(err, marks).with_marks(mark(Phase.FINISHED)), ""
    except Exception as exc:
        log.exception("tool %s crashed on call %s", req.tool, req.call_id)
        outcome = results.from_crash(exc, started=True, may_write=call.may_write, marks=marks)
        return outcome.with_marks(mark(Phase.FINISHED)), ""
    outcome = results.from_output(
        out, may_write=call.may_write, cap=limits.output_cap_bytes, marks=marks
    )
    return outcome.with_marks(mark(Phase.FINISHED)), out.raw()


def _declared_placement(call: ValidCall) -> Placement | None:
    """What the tool's declaration says about where it runs (backend, limits)."""
    if call.placement is not None:
        return (call.placement.backend, call.placement.limits)
    return None


def call_limits(
    base: Limits, set_by: CallLimits, call: ValidCall, deadline: float | None
) -> tuple[Limits, float]:
    """The daemon's limits with the policy's `limits:` for this call applied, and the
    call's timeout: the policy's caps the one the call asked for, the run's deadline
    caps both."""
    limits = base
    if set_by.grace is not None:
        limits = replace(limits, grace=min(set_by.grace, limits.max_grace))
    if set_by.output_cap is not None:
        limits = replace(limits, output_cap_bytes=min(set_by.output_cap, limits.raw_cap_bytes))
    if set_by.file_cap is not None:  # the policy tightens the daemon's cap, never raises it
        limits = replace(limits, file_cap_bytes=min(set_by.file_cap, limits.file_cap_bytes))
    timeout = call.timeout if set_by.timeout is None else min(call.timeout, set_by.timeout)
    if deadline is not None:
        timeout = max(min(timeout, deadline - time.time()), 0.0)
    return limits, timeout
