"""One approval: a call an `ask` rule parked, as the `approvals` table keeps it."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import ExecgateError
from .requests import DEFAULT_WORKSPACE, CallRequest


class ApprovalState(enum.Enum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    id: str
    run_id: str
    call_id: str
    batch_id: str
    tool: str
    arguments_json: str
    # The identity that made the call; it may never decide it.
    requester: str
    rule_id: str
    reason: str
    # Identity names or roles (from the rule) that may decide.
    approvers: tuple[str, ...]
    created_at: float
    expires_at: float
    state: ApprovalState
    decided_by: str = ""
    # The decider's comment, or why it expired.
    comment: str = ""
    decided_at: float | None = None
    # The rest of the request, for the daemon that re-parks it after a restart.
    idempotency_key: str = ""
    timeout: float | None = None
    # The workspace the call works in (chosen before it was parked).
    workspace: str = DEFAULT_WORKSPACE

    def request(self) -> CallRequest:
        """The parked call's request, as the client sent it."""
        return CallRequest(
            run_id=self.run_id,
            call_id=self.call_id,
            batch_id=self.batch_id,
            index=0,
            tool=self.tool,
            arguments_json=self.arguments_json,
            idempotency_key=self.idempotency_key,
            timeout=self.timeout,
            workspace=self.workspace,
        )


class Detached(ExecgateError):
    """The daemon is stopping while the call awaits approval: the approval stays
    pending and the next daemon resumes the call; this one stops following it."""

    def __init__(self, approval: Approval) -> None:
        super().__init__(f"call {approval.call_id} awaits approval {approval.id}")
        self.approval = approval
