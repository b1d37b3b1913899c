"""The dispatcher's side of telemetry: a span per batch, and each call's spans and
metrics once its outcome is reported (tracing.py and metrics.py build them)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from execgate.executor.core.outcomes import Outcome
from execgate.executor.telemetry.metrics import Metrics
from execgate.executor.telemetry.tracing import BatchSpan, CallFacts, Tracing

from .calls import Approved, Authorized, CallRequest, Reached
from .events import Batch

log = logging.getLogger("execgate.dispatch")


class CallTelemetry:
    def __init__(self) -> None:
        # Set by the server; no-ops until then.
        self.tracing = Tracing(None)
        self.metrics = Metrics(None)

    def attach(self, batch: Batch, metadata: Sequence[tuple[str, Any]], n: int) -> BatchSpan:
        """The batch's span (a child of the caller's, from `metadata`); its calls'
        spans follow from `batch.on_finished`. The caller ends the span."""
        span = self.tracing.batch_span(metadata, batch.run_id, batch.batch_id, batch.agent, n)
        batch.trace = span.get_span_context()  # a running call's trace (callspan.parent_for)

        def finished(req: CallRequest, outcome: Outcome, reached: Reached) -> None:
            # After the FINISHED event is on its way: telemetry never delays an outcome.
            asyncio.get_running_loop().call_soon(
                self._record, span, req, outcome, batch.agent, reached
            )

        batch.on_finished = finished
        return span

    def shutdown(self) -> None:
        self.tracing.shutdown()  # flushes spans into the journal, then over OTLP
        self.metrics.shutdown()

    def _record(
        self, span: BatchSpan, req: CallRequest, outcome: Outcome, agent: str, reached: Reached
    ) -> None:
        try:
            facts = CallFacts(tool=req.tool, agent=agent, index=req.index)
            if reached is not None:
                facts = _facts(facts, reached)
            self.tracing.call_spans(span, req.run_id, req.call_id, outcome, facts)
            self.metrics.record(req.tool, outcome)
        except Exception:  # telemetry must never cost a call its outcome
            log.exception("telemetry of call %s failed", req.call_id)


def _facts(facts: CallFacts, reached: Authorized | Approved) -> CallFacts:
    authorized = reached.authorized if isinstance(reached, Approved) else reached
    a = reached.approval if isinstance(reached, Approved) else None
    claims = authorized.valid.effects.claims
    facts.resources = tuple((c.key.render(), c.mode.value) for c in claims)
    facts.policy_span = authorized.span
    facts.policy_effect = authorized.record.effect
    facts.policy_rules = authorized.record.rule_ids
    if a is not None:
        about = {
            "execgate.approval.id": a.id,
            "execgate.approval.rule_id": a.rule_id,
            "execgate.approval.state": a.state.value,
            "execgate.approval.decided_by": a.decided_by,
        }
        facts.approval = (a.created_at, a.decided_at or a.created_at, about)
    return facts
