"""The journal's store interfaces: what the rooms above may ask of the journal, one
Protocol per record kind, in domain types (no connection, no row, no SQL).

`JournalStore` is one backend as a whole: it is the call store itself and holds the
store of every other record kind. `store.Journal` (SQLite, the embedded default)
implements it; a PostgreSQL store implements the same (docs/architecture.md,
"Journal": the table of record kinds).

What every backend must keep (the outcome and recovery guarantees rest on it):
- a write marked or documented durable is committed, surviving a machine crash,
  before its await returns; nothing is reported before its record is committed;
- durability follows commit order: a write committed without it (`durable=False`)
  is made durable no later than the next durable write that returns (one log, written
  in commit order: SQLite's WAL, PostgreSQL's WAL). A loop step's opening
  transitions rely on it (`RunRecordStore.append`);
- a method documented as one transaction is atomic (a run's row with its events;
  a run's insert with the check that its id is free; an approval's conditional
  transition with the read of its new row);
- methods documented "at startup" block (they run before the daemon serves).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from execgate.executor.core.approval import Approval, ApprovalState
from execgate.executor.core.outcomes import Outcome
from execgate.executor.core.run import CancelAsk, Run
from execgate.executor.core.runstate import Transition

from .records import (
    CallFilter,
    CallRecord,
    CancelRecord,
    Durable,
    Notice,
    PolicyRecord,
    RunClaim,
    RunConflict,
    SpanRecord,
)

__all__ = [
    "ApprovalStore",
    "CallStore",
    "CancelStore",
    "JournalStore",
    "NoticeStore",
    "ReloadStore",
    "RunRecordStore",
    "SpanStore",
]


class CallStore(Protocol):
    """Calls (`calls`) and the refusals of calls whose id was taken (`refusals`).

    A call's (run_id, call_id) is unique: a second intent or finished row for it
    raises `records.DuplicateCall`, and so does an outcome whose intent never landed.
    (agent, idempotency_key) is unique where a key is given.
    """

    async def record_intent(self, rec: CallRecord) -> None:
        """The call is about to start (a running row), durably."""
        ...

    def begin_intent(self, rec: CallRecord) -> Durable:
        """Start recording that the call is about to start (a running row), durably,
        without waiting. The caller lets nothing of the call become visible before
        the returned write is committed (`Durable.wait` / `done`); until then the
        call may only prepare what nobody can see (docs/architecture.md, "The
        durable write path")."""
        ...

    def record_intent_nowait(self, rec: CallRecord) -> None:
        """A read-only call is about to start: queued, not waited for, not fsync'd. A
        failure shows at its `record_outcome` (DuplicateCall)."""
        ...

    async def record_outcome(
        self, run_id: str, call_id: str, outcome: Outcome, raw: str, *, durable: bool
    ) -> None:
        """The running call ended with `outcome` (and `raw`, the unbounded result);
        with fsync if `durable`."""
        ...

    async def record_finished(self, rec: CallRecord, outcome: Outcome, raw: str = "") -> None:
        """A call that never ran (rejected) or was answered by replay: one finished row."""
        ...

    async def record_refusal(self, rec: CallRecord, outcome: Outcome) -> None:
        """A call refused whose id belongs to another call (that call is untouched)."""
        ...

    async def get(
        self, run_id: str, call_id: str, *, include_raw: bool = False
    ) -> CallRecord | None: ...

    async def by_idempotency_key(self, agent: str, key: str) -> CallRecord | None: ...

    # Last: below it, `list` in annotations would name this method.
    async def list(self, flt: CallFilter) -> tuple[list[CallRecord], int]:
        """Records newest first, and the cursor (seq) to continue below (0 = no more)."""
        ...


class ApprovalStore(Protocol):
    """Approvals of calls a policy `ask` rule parked (`approvals`). Every write is
    durable; rows are never deleted."""

    async def insert(self, approval: Approval, decision: PolicyRecord | None) -> None:
        """A new pending approval (with the call's policy decision)."""
        ...

    async def transition(
        self, approval_id: str, state: ApprovalState, by: str, comment: str
    ) -> Approval | None:
        """Move the approval from pending to `state` (decided now, by `by`), in one
        transaction with reading it back; None if it was not pending (someone else's
        transition won)."""
        ...

    async def get(self, approval_id: str) -> Approval | None: ...

    async def parked(self, run_id: str, call_id: str) -> Approval | None:
        """The pending approval of that call, if it is parked."""
        ...

    async def pending(self) -> list[Approval]:
        """Every pending approval, oldest first."""
        ...

    async def of_run(self, run_id: str) -> list[Approval]:
        """Every approval of the run, oldest first."""
        ...

    def left_pending(self) -> list[Approval]:
        """At startup: the approvals a previous daemon left pending, oldest first."""
        ...


class RunRecordStore(Protocol):
    """Agent runs (`runs`) and their events (`run_events`, seq 1, 2, ... per run).
    Every write is durable, but an `append` told otherwise. (Not `RunStore`: that is
    executor/runs/registry.py, the run rules above this.)"""

    async def insert(self, run: Run) -> RunConflict | None:
        """Insert the run unless its id is taken (None: inserted). Taken: the run
        exists, or identities other than its owner have calls (or calls parked for
        approval) under its id. The check and the insert are one transaction."""
        ...

    async def append(self, run_id: str, events: list[Transition], *, durable: bool = True) -> Run:
        """Append the events and move the run's state, reason, last_seq to the last
        one, in one transaction; the run as it now is. The caller checked them.
        `durable=False`: committed (it survives the daemon's crash) without waiting for
        the disk; the next durable write makes it durable (see the module's rules). A
        loop step's opening uses it: its batch's writing calls fsync their intents, and
        its end is durable, so the opening is durable before anything depends on it."""
        ...

    async def request_cancel(self, run_id: str, ask: CancelAsk) -> Run:
        """Record who asked the run to stop, unless someone did already (the first
        stands); the run as it now is."""
        ...

    async def sync(self, run_id: str) -> None:
        """Make every write committed so far durable (an append told `durable=False`
        among them) before returning: a durable write of the run's row (it may move the
        row's `updated_at` on, never back)."""
        ...

    async def get(self, run_id: str) -> Run | None: ...

    async def events(self, run_id: str, after_seq: int = 0) -> list[Transition]:
        """The run's events after `after_seq`, in order."""
        ...

    async def find(
        self,
        states: Sequence[str],
        owner: str,
        limit: int,
        owners: tuple[str, ...] | None = None,
    ) -> list[Run]:
        """At most `limit` runs, newest first: in one of `states` (any if empty), of
        `owner` (any if ""), of an owner matching one of the * ? globs `owners` (any
        if None)."""
        ...

    async def claim(self, run_id: str) -> RunClaim:
        """Who may speak for the run id: its owner, and every identity with calls or
        parked calls under it."""
        ...

    def ended(self) -> dict[str, str]:
        """At startup: run id -> terminal state, of every run that ended."""
        ...

    def owners(self) -> dict[str, str]:
        """At startup: run id -> owner, of every started run."""
        ...

    def workspaces(self) -> dict[str, str]:
        """At startup: run id -> the workspace it is bound to, of every started run."""
        ...


class CancelStore(Protocol):
    """Cancel requests (`cancels`), each recorded before anything is signalled."""

    async def record(self, rec: CancelRecord) -> None:
        """The request, durably."""
        ...

    def barred_runs(self) -> dict[str, CancelRecord]:
        """At startup: run id -> the first whole-run cancel of every run cancelled."""
        ...


class ReloadStore(Protocol):
    """Versions of a watched configuration file (policy, identities) a running daemon
    was shown, accepted or refused (`policy_events`)."""

    async def record(self, source: str, revision: str, *, accepted: bool, message: str) -> None:
        """One version's fate (stamped now), durably."""
        ...


class SpanStore(Protocol):
    """The daemon's OpenTelemetry spans (`spans`): a view of the calls' records."""

    def add(self, spans: Sequence[SpanRecord]) -> None:
        """Write the spans in one transaction, not fsync'd, and block until committed
        (called from the span processor's thread, never the event loop's)."""
        ...


class NoticeStore(Protocol):
    """What other daemons sharing this journal recorded that this one must act on: a
    cancel, a decided approval, a run's change, a keyed call's end. A journal only one
    daemon writes (SQLite) never has any."""

    def subscribe(self, fn: Callable[[Notice], None]) -> Callable[[], None]:
        """Call `fn` on the calling thread's running event loop with each notice from
        now on (and `NoticeKind.RESYNC` when some may have been missed); returns the
        unsubscriber."""
        ...


class JournalStore(CallStore, Protocol):
    """One journal backend: the calls, and the store of every other record kind."""

    @property
    def approvals(self) -> ApprovalStore: ...

    @property
    def runs(self) -> RunRecordStore: ...

    @property
    def cancels(self) -> CancelStore: ...

    @property
    def reloads(self) -> ReloadStore: ...

    @property
    def spans(self) -> SpanStore: ...

    @property
    def notices(self) -> NoticeStore: ...

    def recover(self) -> int:
        """At startup, before serving: settle every call a previous daemon left running
        (UNKNOWN_OUTCOME/interrupted if it may write, else FAILURE/interrupted, with a
        `recovered` mark); how many."""
        ...

    def close(self) -> None: ...
