"""What the journal records, as the rooms above see it (no SQL, no connection)."""

from __future__ import annotations

import enum
import functools
import json
from dataclasses import dataclass
from typing import Protocol

from execgate.executor.core.approval import Approval
from execgate.executor.core.errors import ExecgateError
from execgate.executor.core.outcomes import Outcome, Status
from execgate.executor.core.requests import DEFAULT_WORKSPACE


class DuplicateCall(ExecgateError):
    """The (run_id, call_id) pair is already in the journal."""

    def __init__(self, run_id: str, call_id: str) -> None:
        super().__init__(f"call_id {call_id!r} is already used in run {run_id!r}")
        self.run_id = run_id
        self.call_id = call_id


class Durable(Protocol):
    """A durable write under way (`CallStore.begin_intent`). Either wait raises the
    write's error (`records.DuplicateCall` for a taken call id)."""

    def wait(self) -> None:
        """Block until it is committed with fsync (from a worker thread: never the
        event loop's). Safe to call from several threads, and more than once."""
        ...

    async def done(self) -> None:
        """Await the same on the event loop."""
        ...


class KeyTaken(ExecgateError):
    """The agent's idempotency key already names another call in the journal: one that
    a daemon sharing the journal recorded first (the unique (agent, key) index)."""

    def __init__(self, agent: str, key: str) -> None:
        super().__init__(f"idempotency_key {key!r} of {agent!r} names another call")
        self.agent = agent
        self.key = key


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """The policy decision a call got: what, by which rules, under which file revision."""

    effect: str
    rule_ids: tuple[str, ...]
    revision: str
    # Rules in shadow mode that matched (logged, not enforced), as "id:effect".
    shadow: tuple[str, ...] = ()

    def to_json(self) -> str:
        return _policy_json(self.effect, self.rule_ids, self.revision, self.shadow)

    @staticmethod
    def from_json(text: str) -> PolicyRecord:
        d = json.loads(text)
        return PolicyRecord(d["effect"], tuple(d["rules"]), d["revision"], tuple(d["shadow"]))


# Every call's record carries its decision; a policy makes few distinct ones, so
# each is encoded once (bounded: a policy reload brings new revisions).
@functools.lru_cache(maxsize=512)
def _policy_json(
    effect: str, rules: tuple[str, ...], revision: str, shadow: tuple[str, ...]
) -> str:
    return json.dumps(
        {"effect": effect, "rules": rules, "revision": revision, "shadow": shadow},
        separators=(",", ":"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    run_id: str
    call_id: str
    batch_id: str
    tool: str
    arguments_json: str
    request_hash: str
    idempotency_key: str
    agent: str
    may_write: bool
    created_at: float
    # None while the call is running.
    outcome: Outcome | None = None
    replay_of: str = ""
    raw_result: str = ""
    decision: PolicyRecord | None = None
    # The workspace it worked in (pipeline/workspaces.py).
    workspace: str = DEFAULT_WORKSPACE


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFilter:
    run_id: str = ""
    statuses: tuple[Status, ...] = ()
    tool: str = ""
    # Only calls in this workspace ("": any).
    workspace: str = ""
    since: float | None = None
    until: float | None = None
    # Only finished calls whose outcome was recorded at or after this time.
    finished_since: float | None = None
    limit: int = 100
    # Only records with seq below this (paging, newest first); 0 = no bound.
    before_seq: int = 0
    # Only calls made by agents matching these names or * ? globs, or made in runs
    # such agents own (scope.Scope); None = all.
    agents: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRecord:
    """One Cancel request as the journal keeps it. Without call_id and batch_id it
    cancels its whole run (the run is barred: no later call of it starts)."""

    at: float
    requester: str
    reason: str
    run_id: str
    batch_id: str = ""
    call_id: str = ""
    grace: float | None = None
    # Set for a requester who may stop only its own calls (an agent): the identity every
    # targeted call must belong to. Not stored: it travels to the other daemons sharing
    # the journal with the request (`Notice`), which reach only that agent's calls.
    only_agent: str = ""


@dataclass(frozen=True, slots=True)
class RunClaim:
    """Who may speak for a run id: the owner of its runs row (None if it was never
    started with StartRun) and every identity with calls, or calls parked for
    approval, recorded under it."""

    owner: str | None
    agents: frozenset[str]


@dataclass(frozen=True, slots=True)
class RunConflict:
    """Why a run could not be started under its id: it exists already, or `others`
    (identities other than its owner) have calls recorded under it."""

    exists: bool = False
    others: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanRecord:
    """One finished OpenTelemetry span, as the journal keeps it (ids in hex, times in
    epoch seconds, attributes and events as JSON)."""

    trace_id: str
    span_id: str
    # "" for a root span.
    parent_id: str
    name: str
    start: float
    end: float
    status: str
    # From the span's execgate.run_id / execgate.call_id attributes ("" if none).
    run_id: str
    call_id: str
    attributes_json: str
    events_json: str


class NoticeKind(enum.Enum):
    """What another daemon sharing the journal recorded (`base.Notices`)."""

    # A Cancel request (`cancel` holds it): the calls it targets that run here stop.
    CANCEL = "cancel"
    # An approval (`key`: its id) was made, decided or expired: Watch streams show it, and
    # a call parked here may go on.
    APPROVAL = "approval"
    # A run (`key`: its id) was started, appended to, or asked to stop.
    RUN = "run"
    # A call with an idempotency key (`key`: agent NUL key) ended.
    CALL = "call"
    # Notices may have been missed (the connection to the journal was re-established):
    # re-read whatever is being waited for.
    RESYNC = "resync"
    # Approvals a dead daemon had parked passed to this daemon (`approvals`): park them.
    ADOPTED = "adopted"
    # This daemon lost its lease: it may no longer act as the holder of its locks.
    LEASE_LOST = "lease_lost"


@dataclass(frozen=True, slots=True)
class Notice:
    kind: NoticeKind
    key: str = ""
    cancel: CancelRecord | None = None
    approvals: tuple[Approval, ...] = ()
