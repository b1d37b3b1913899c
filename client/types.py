"""The client's own types: what an agent developer handles. No protobuf leaks out of here."""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from typing import Any


class Status(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    REJECTED = "rejected"
    PARTIAL = "partial"
    UNKNOWN_OUTCOME = "unknown_outcome"


class StopMode(enum.Enum):
    UNSPECIFIED = "unspecified"
    NOT_STARTED = "not_started"
    COMPLETED = "completed"
    COOPERATIVE = "cooperative"
    FORCE_TERMINATED = "force_terminated"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class Mark:
    """A moment in a call's life: phase name (queued, started, ...) and epoch seconds."""

    phase: str
    at: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Evidence:
    exit_code: int | None = None
    signal: int | None = None
    bytes_written: int | None = None
    bytes_read: int | None = None
    sha256_before: str | None = None
    sha256_after: str | None = None
    path: str = ""
    # The sandbox a process-based call ran in; set when the sandbox's memory limit
    # killed it; processes left alive after a stop (0: verified none).
    sandbox: str = ""
    oom_killed: bool | None = None
    survivors: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How one call ended. `text`/`structured` are the bounded result meant for the model."""

    call_id: str
    status: Status
    # "none" on success; otherwise invalid_argument, not_found, timeout, ... (see README).
    error_class: str
    message: str = ""
    field: str = ""
    text: str = ""
    structured: dict[str, Any] = dataclasses.field(default_factory=dict)
    truncated: bool = False
    returned_bytes: int = 0
    total_bytes: int = 0
    evidence: Evidence = dataclasses.field(default_factory=Evidence)
    timeline: tuple[Mark, ...] = ()
    stopped_how: StopMode = StopMode.UNSPECIFIED
    # Set when the daemon answered from the journal (idempotency key): the call that ran.
    replay_of: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.SUCCESS

    def mark(self, phase: str) -> Mark | None:
        return next((m for m in self.timeline if m.phase == phase), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """A tool call to send. `arguments` may be a dict or the model's raw JSON text."""

    tool: str
    arguments: dict[str, Any] | str = dataclasses.field(default_factory=dict)
    call_id: str = ""
    idempotency_key: str = ""
    timeout: float | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    destructive: bool
    idempotent: bool
    # "builtin", "command" (declared in the tools file) or "mcp:SERVER".
    provider: str = "builtin"
    # The effects above are believed (the daemon's, the operator's, a trusted server's);
    # False: an untrusted server's tool, scheduled as a writer whatever it says.
    annotations_trusted: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderStatus:
    """One MCP server of the daemon's tools file, now (`Client.list_providers`)."""

    provider: str  # "mcp:git"
    running: int  # live processes (0: not started yet, or stopped between calls)
    restarts: int
    last_error: str  # "" if it never failed
    tools: int  # tools of it served


class EventKind(enum.Enum):
    QUEUED = "queued"
    WAITING = "waiting"
    # A policy rule asks a human first: see `approval_id` (Client.approve / deny).
    AWAITING_APPROVAL = "awaiting_approval"
    STARTED = "started"
    # The running call's tool reported progress (an MCP server's notification).
    PROGRESS = "progress"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One step of a call in an Execute stream; `outcome` is set on FINISHED."""

    kind: EventKind
    call_id: str
    batch_id: str
    at: float
    # The call's position in the batch, from 0 (tells duplicate call ids apart).
    index: int = 0
    # WAITING only: the resources it conflicts on, and the calls ("run/call") it waits for.
    keys: tuple[str, ...] = ()
    blocked_by: tuple[str, ...] = ()
    # AWAITING_APPROVAL only: the approval to decide, the rule that asks, and until when.
    approval_id: str = ""
    rule_id: str = ""
    reason: str = ""
    expires_at: float | None = None
    # PROGRESS only: how far, out of `total` (0: not said), and the tool's message.
    progress: float = 0.0
    total: float = 0.0
    progress_message: str = ""
    outcome: Outcome | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """A call as the daemon's journal holds it."""

    run_id: str
    call_id: str
    batch_id: str
    tool: str
    arguments_json: str
    idempotency_key: str
    agent: str
    may_write: bool
    created_at: float
    running: bool
    # None while the call is still running.
    outcome: Outcome | None = None
    replay_of: str = ""
    raw_result: str = ""
    # The policy decision the call got; None if it was refused before one was made.
    policy: PolicyDecision | None = None
    # Set while a policy `ask` rule holds the call (not started, no outcome yet): the
    # approval it waits for, when that expires, and who may decide it.
    awaiting_approval: str = ""
    approval_expires_at: float | None = None
    approvers: tuple[str, ...] = ()
    # The workspace it worked in ("" for a call refused before one was chosen that
    # named none).
    workspace: str = ""


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    effect: str
    rule_ids: tuple[str, ...]
    revision: str
    # Shadow-mode rules that matched ("rule_id:effect"): logged, not enforced.
    shadow: tuple[str, ...] = ()
    # effect "ask" in an Explain: who may approve (identity names or roles).
    approvers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CallPlan:
    """How the daemon would schedule one call of a batch (Explain); nothing runs."""

    call_id: str
    index: int
    tool: str
    may_write: bool
    # (key, "read" | "write"): what the call touches, e.g. ("file:/ws/a.txt", "read").
    claims: tuple[tuple[str, str], ...]
    # (key, mode) with modes IS, IX, S, SIX, X: the locks that implies.
    locks: tuple[tuple[str, str], ...]
    # Earlier calls of the batch it would wait for.
    waits_for: tuple[str, ...]
    # Set when the call would be REJECTED before scheduling.
    rejected: Outcome | None = None
    # The policy decision it would get; None when validation refused it first.
    policy: PolicyDecision | None = None

    @property
    def needs_approval(self) -> bool:
        """It would be parked until an approver decides (policy effect `ask`)."""
        return self.policy is not None and self.policy.effect == "ask"


@dataclass(frozen=True, slots=True)
class RuleVerdict:
    """One rule of the policy file, against the described call (ExplainPolicy)."""

    rule_id: str
    effect: str
    shadow: bool
    # The matchers that did not match the call (empty: the rule matches).
    not_matched_by: tuple[str, ...]

    @property
    def matches(self) -> bool:
        return not self.not_matched_by


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyExplanation:
    """Why the daemon's policy would decide a described call as it does (ExplainPolicy)."""

    # effect, rule ids (empty: the file's default), revision, shadow; approvers for "ask".
    decision: PolicyDecision
    reason: str
    # Every rule of the file, in file order.
    rules: tuple[RuleVerdict, ...]
    # effect "ask": seconds the approval would stay open; None otherwise.
    approval_ttl: float | None = None
    # The sandbox and limits the call would run with ("daemon default" where the
    # policy is silent).
    runs_with: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Where the daemon read the policy from.
    source: str = ""

    @property
    def effect(self) -> str:
        return self.decision.effect


class ApprovalState(enum.Enum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    # The ttl passed, the call was stopped, or the daemon stopped while it was pending.
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    """A call a policy `ask` rule parked until an approver decides."""

    approval_id: str
    run_id: str
    call_id: str
    batch_id: str
    tool: str
    arguments_json: str
    # Who made the call; it may not decide it.
    requester: str
    rule_id: str
    reason: str
    # Identity names or roles that may decide.
    approvers: tuple[str, ...]
    created_at: float
    expires_at: float
    state: ApprovalState
    decided_by: str = ""
    comment: str = ""
    decided_at: float | None = None
    # The workspace the parked call works in.
    workspace: str = ""
