"""The pipeline's stage records: frozen values, each stage's output the next one's input.

validate -> ValidCall -> authorize -> Authorized -> approve -> Approved, on the real
validator, authorizer and policy (no daemon, nothing runs). What a call's ending
reports (its journal decision, its trace facts) is read from the furthest record it
reached; the in-flight entry keeps only what a cancel and a re-send need.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

from execgate.executor.core.approval import Approval, ApprovalState
from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass
from execgate.executor.core.paths import Workspace
from execgate.executor.pipeline import telemetry
from execgate.executor.pipeline.approve import verdict
from execgate.executor.pipeline.authorize import Authorizer
from execgate.executor.pipeline.calls import Approved, Authorized, CallRequest, ValidCall
from execgate.executor.pipeline.endings import decided
from execgate.executor.pipeline.inflight import Active
from execgate.executor.pipeline.validate import Validator
from execgate.executor.policy import Effect, parse_policy
from execgate.executor.sandbox.ladder import CancelScope
from execgate.executor.telemetry.tracing import CallFacts
from execgate.executor.tools import Limits, builtin_tools

POLICY = textwrap.dedent(
    """\
    version: 1
    default: deny
    rules:
      - {id: reads, effect: allow, tools: [read_file, list_dir], reason: reading is fine}
      - id: writes
        effect: ask
        tools: [write_file]
        approvers: [approver]
        ttl: 60
        reason: writes need a human
    """
)


def _request(tool: str, **args: object) -> CallRequest:
    return CallRequest(
        run_id="r1",
        call_id=f"c-{tool}",
        batch_id="b1",
        index=0,
        tool=tool,
        arguments_json=json.dumps(args),
    )


@pytest.fixture
def stages(tmp_path: Path) -> tuple[Validator, Authorizer]:
    (tmp_path / "a.txt").write_text("hello\n")
    ws = Workspace(tmp_path)
    validator = Validator(builtin_tools(), ws, Limits())
    return validator, Authorizer(parse_policy(POLICY, "policy.yaml"))


def _valid(validator: Validator, req: CallRequest) -> ValidCall:
    return asyncio.run(validator.validate(req))


def _authorized(stages: tuple[Validator, Authorizer], req: CallRequest) -> Authorized:
    validator, authorizer = stages
    return authorizer.authorize(_valid(validator, req), "agent-1")


def _approval(state: ApprovalState) -> Approval:
    return Approval(
        id="appr_1",
        run_id="r1",
        call_id="c-write_file",
        batch_id="b1",
        tool="write_file",
        arguments_json="{}",
        requester="agent-1",
        rule_id="writes",
        reason="writes need a human",
        approvers=("approver",),
        created_at=10.0,
        expires_at=70.0,
        state=state,
        decided_by="alice" if state is not ApprovalState.PENDING else "",
        decided_at=12.0 if state is not ApprovalState.PENDING else None,
    )


def test_each_stage_takes_the_record_the_one_before_returned(
    stages: tuple[Validator, Authorizer],
) -> None:
    validator, authorizer = stages
    valid = _valid(validator, _request("read_file", path="a.txt"))
    assert isinstance(valid, ValidCall)

    authorized = authorizer.authorize(valid, "agent-1")
    assert authorized.valid is valid
    assert authorized.request is valid.request
    assert authorized.decision.effect is Effect.ALLOW
    assert authorized.record.effect == "allow"
    assert authorized.record.rule_ids == ("reads",)
    assert authorized.policy_input.paths == ("a.txt",)
    assert authorized.policy_input.agent == "agent-1"
    began, ended = authorized.span
    assert began <= ended
    authorizer.enforce(authorized)  # allowed: returns

    approved = Approved(authorized=authorized)
    assert approved.authorized is authorized
    assert approved.valid is valid
    assert approved.request is valid.request
    verdict(approved, CancelScope())  # nothing asked: it may go on


def test_a_deny_is_decided_on_a_record_then_refused(
    stages: tuple[Validator, Authorizer],
) -> None:
    _, authorizer = stages
    authorized = _authorized(stages, _request("run_command", argv=["ls"]))
    assert authorized.decision.effect is Effect.DENY
    with pytest.raises(ToolError) as raised:
        authorizer.enforce(authorized)
    assert raised.value.error_class is ErrorClass.POLICY_DENIED
    # The refusal's journal row keeps the decision it was refused on.
    assert decided(authorized) == authorized.record


def test_an_ask_is_settled_into_the_approved_record(
    stages: tuple[Validator, Authorizer],
) -> None:
    authorized = _authorized(stages, _request("write_file", path="b.txt", content="x"))
    assert authorized.decision.ask is not None
    assert authorized.decision.ask.id == "writes"

    approved = Approved(authorized=authorized, approval=_approval(ApprovalState.APPROVED))
    verdict(approved, CancelScope())
    assert decided(approved) == authorized.record

    denied = Approved(authorized=authorized, approval=_approval(ApprovalState.DENIED))
    with pytest.raises(ToolError) as raised:
        verdict(denied, CancelScope())
    assert raised.value.error_class is ErrorClass.APPROVAL_DENIED

    expired = Approved(authorized=authorized, approval=_approval(ApprovalState.EXPIRED))
    with pytest.raises(ToolError) as raised:
        verdict(expired, CancelScope())
    assert raised.value.error_class is ErrorClass.APPROVAL_EXPIRED

    stopped = CancelScope()
    stopped.cancel("operator said stop")
    with pytest.raises(ToolError) as raised:
        verdict(expired, stopped)
    assert raised.value.error_class is ErrorClass.CANCELLED


def test_records_are_frozen(stages: tuple[Validator, Authorizer]) -> None:
    authorized = _authorized(stages, _request("read_file", path="a.txt"))
    approved = Approved(authorized=authorized)
    for record, name in (
        (authorized.valid, "timeout"),
        (authorized, "decision"),
        (authorized, "span"),
        (approved, "approval"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, name, None)
    # slots: no attribute can be added beside the fields either.
    for record in (authorized, approved):
        with pytest.raises((AttributeError, TypeError)):
            record.extra = 1  # type: ignore[attr-defined]


def test_the_trace_reads_the_furthest_record(stages: tuple[Validator, Authorizer]) -> None:
    authorized = _authorized(stages, _request("write_file", path="b.txt", content="x"))
    approved = Approved(authorized=authorized, approval=_approval(ApprovalState.APPROVED))
    root = str(authorized.valid.paths["path"].parent)

    facts = telemetry._facts(CallFacts(tool="write_file"), authorized)
    assert facts.policy_span == authorized.span
    assert facts.policy_effect == "ask"
    assert facts.policy_rules == ("writes",)
    # What the call touches, named by its path in the call's workspace.
    assert facts.resources == ((f"file:{root}/b.txt", "write"),)
    assert facts.approval is None  # not settled yet

    facts = telemetry._facts(CallFacts(tool="write_file"), approved)
    assert facts.approval is not None
    start, end, about = facts.approval
    assert (start, end) == (10.0, 12.0)
    assert about["execgate.approval.state"] == "approved"
    assert about["execgate.approval.decided_by"] == "alice"


def test_the_in_flight_entry_holds_no_stage_results() -> None:
    fields = {f.name for f in dataclasses.fields(Active)}
    assert fields == {"scope", "batch", "started", "parked", "ended"}
