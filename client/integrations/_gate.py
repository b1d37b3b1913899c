"""What the framework adapters share, framework-free: one agent run's tool calls through
the daemon.

- The daemon's tools (`ListTools`) under names a model accepts: OpenAI-style function
  names allow only `[A-Za-z0-9_-]{1,64}`, and an MCP server's tools are `SERVER.TOOL`.
- A call carries the framework's tool-call id as its call id, and `RUN:ID` as its
  idempotency key (the loop's convention, `execgate.client.loop.batch.to_call`): a
  framework that re-sends a call after a crash or a resume gets the journal's outcome,
  the call never runs twice.
- A turn's calls go out as one batch on the Execute stream, not the unary ExecuteBatch:
  the stream carries the `awaiting_approval` event of a call a policy `ask` rule parks,
  so the application hears of the wait while it lasts, not only when the call ends.
- A cancelled turn (the framework cancels the task awaiting the batch) is passed on to
  the daemon's `Cancel` for that batch before the cancellation goes on: dropping the
  stream alone stops only calls still queued; a started call would run to its end.
- Each outcome becomes the text the model reads, with its status, error class and a
  hint (`execgate.client.loop.observe`, the same text the client's own loop sends).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._async import AsyncClient
from ..errors import ExecgateClientError
from ..loop.observe import DEFAULT_CAP, Observation, observe
from ..types import Call, Event, EventKind, Outcome, Status, ToolSpec

log = logging.getLogger("execgate.client.integrations")

# OpenAI's function-name rule, which the other providers' are no looser than.
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64
# How long a cancelled turn waits for the daemon to take its Cancel: the framework is
# tearing the run down, and a daemon that does not answer must not hold that up forever.
CANCEL_WAIT_S = 10.0

EventHook = Callable[[Event], object]


@dataclass(frozen=True, slots=True)
class GateTool:
    """One of the daemon's tools, and the name the model calls it by."""

    name: str
    spec: ToolSpec


def model_names(specs: Iterable[ToolSpec], only: Iterable[str] | None = None) -> list[GateTool]:
    """The tools (those named in `only`, by their execgate names, if given) under names a
    model accepts: `git.status` becomes `git_status`; a name already taken gets `_2`,
    `_3`, ... An unknown name in `only` is a ValueError naming it."""
    specs = list(specs)
    if only is not None:
        wanted = list(only)
        known = {s.name for s in specs}
        missing = [n for n in wanted if n not in known]
        if missing:
            raise ValueError(f"only: the daemon serves no tool named {missing}")
        specs = [s for s in specs if s.name in set(wanted)]
    taken: set[str] = set()
    tools = []
    for spec in specs:
        base = _NOT_IN_A_NAME.sub("_", spec.name)[:_MAX_NAME] or "tool"
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base[: _MAX_NAME - len(str(n)) - 1]}_{n}"
        taken.add(name)
        tools.append(GateTool(name, spec))
    return tools


class Gate:
    """One agent run's tool calls through the daemon.

    Args:
        client: the connection to the daemon.
        run_id: the execgate run the calls belong to. Default: a new id per Gate, so
            that tool-call ids a framework reuses across runs (scripted models do)
            never meet an earlier run's journal; give one to resume a run.
        on_event: called with every event of the calls' streams (queued, waiting,
            awaiting_approval, started, finished); exceptions it raises are logged.
        cap: the most characters of a result the model reads (head and tail kept).
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        run_id: str | None = None,
        on_event: EventHook | None = None,
        cap: int = DEFAULT_CAP,
    ) -> None:
        self.client = client
        self.run_id = run_id if run_id is not None else f"agent-{uuid.uuid4().hex}"
        self.on_event = on_event
        self.cap = cap

    def call(self, tool: str, arguments: Mapping[str, Any] | str, call_id: str | None) -> Call:
        """A call with the framework's id (a fresh one if it gave none: then a re-sent
        call cannot be recognised) and the idempotency key derived from it."""
        call_id = call_id or f"call-{uuid.uuid4().hex}"
        return Call(
            tool=tool,
            arguments=arguments if isinstance(arguments, str) else dict(arguments),
            call_id=call_id,
            idempotency_key=f"{self.run_id}:{call_id}",
        )

    async def run(self, calls: Sequence[Call], *, also: EventHook | None = None) -> list[Outcome]:
        """The calls as one batch; their outcomes in the order given. A call that fails
        is an Outcome; the daemon unreachable or refusing the request raises. `also`:
        a hook for this batch's events, beside `on_event`."""
        batch_id = f"batch-{uuid.uuid4().hex}"
        got: list[Outcome | None] = [None] * len(calls)
        # Read to its end (or until an exception passes through it): the stream never
        # needs closing early.
        stream = self.client.stream(calls, run_id=self.run_id, batch_id=batch_id)
        try:
            async for event in stream:
                self._seen(event, also)
                if event.kind is EventKind.FINISHED and event.outcome is not None:
                    got[event.index] = event.outcome
        except asyncio.CancelledError:
            await self._cancel(batch_id)
            raise
        return [o if o is not None else _unseen(c.call_id) for o, c in zip(got, calls, strict=True)]

    def observe(self, outcome: Outcome, tool: str) -> Observation:
        """What the model reads of an outcome: `observation.render()`."""
        return observe(outcome, tool, cap=self.cap)

    def _seen(self, event: Event, also: EventHook | None) -> None:
        if event.kind is EventKind.AWAITING_APPROVAL:
            log.info(
                "call %s waits for approval %s (rule %s: %s)",
                event.call_id,
                event.approval_id,
                event.rule_id,
                event.reason,
            )
        for hook in (self.on_event, also):
            if hook is None:
                continue
            try:
                hook(event)
            except Exception:  # the application's hook must not break the batch
                log.exception("a hook raised on a %s event of %s", event.kind.value, event.call_id)

    async def _cancel(self, batch_id: str) -> None:
        reason = "the agent framework cancelled the turn"
        try:
            async with asyncio.timeout(CANCEL_WAIT_S):
                reached = await self.client.cancel(
                    run_id=self.run_id, batch_id=batch_id, reason=reason
                )
        except (ExecgateClientError, TimeoutError) as exc:
            log.warning("the cancel of batch %s did not reach the daemon: %s", batch_id, exc)
            return
        log.info("cancelled batch %s at the daemon: %s", batch_id, reached)


def _unseen(call_id: str) -> Outcome:
    # The daemon ends a stream with an error when a call has no outcome to send; this
    # stands for a stream that ended early all the same.
    return Outcome(
        call_id=call_id,
        status=Status.UNKNOWN_OUTCOME,
        error_class="internal",
        message="the daemon's stream ended without this call's outcome; "
        "GetCall shows what became of it",
    )
