"""What the operator typed, resolved: a unique id prefix, a call in any run, any run.

Tables print ids whole, and every command that takes one (`calls show`, `cancel --call`,
`approvals approve|deny`, `trace`, `runs show`) also takes a unique prefix of it. An exact
id is tried first (one lookup on the daemon); only when it is not found are the recent
records scanned (`SCAN` of them, newest first) for ids starting with it. More than one
match is `AmbiguousPrefix`, naming the candidates.

Every run can be shown: a run the Runs service never heard of (the implicit `default`
run, or an agent calling Execute with its own run id) is built from its calls in the
journal, marked `NO_RECORD`.
"""

from __future__ import annotations

from collections.abc import Iterable

from execgate.client import (
    CallNotFound,
    CallRecord,
    Client,
    ExecgateClientError,
    PermissionDenied,
    RunDetail,
    RunInfo,
    RunNotFound,
)
from execgate.executor.core.errors import ExecgateError

# How many recent records a prefix is looked up among.
SCAN = 5000
# Shown in place of a run's state when the Runs service has no record of it.
NO_RECORD = "no run record"
DEFAULT_RUN = "default"


class AmbiguousPrefix(ExecgateError, ExecgateClientError):
    """`prefix` starts more than one `kind` id (`matches`, the first few)."""

    def __init__(self, kind: str, prefix: str, matches: Iterable[str]) -> None:
        self.kind = kind
        self.prefix = prefix
        self.matches = tuple(sorted(matches))
        shown = ", ".join(self.matches[:5]) + (" …" if len(self.matches) > 5 else "")
        super().__init__(
            f"ambiguous prefix {prefix!r}: {len(self.matches)} {kind} ids start with it "
            f"({shown}); give more of the id"
        )


def one(kind: str, prefix: str, ids: Iterable[str]) -> str | None:
    """The only id in `ids` that starts with `prefix` (the id itself if present)."""
    found = {i for i in ids if i.startswith(prefix)}
    if prefix in found:
        return prefix
    if len(found) > 1:
        raise AmbiguousPrefix(kind, prefix, found)
    return next(iter(found), None)


def call(client: Client, call_id: str, run_id: str = "", *, raw: bool = False) -> CallRecord:
    """The call `call_id` (or the one it is a unique prefix of), in `run_id` or, when
    that is "", in whichever run has it."""
    try:
        return client.get_call(call_id, run_id=run_id or DEFAULT_RUN, include_raw=raw)
    except CallNotFound:
        pass
    recent = client.list_calls(run_id=run_id, limit=SCAN)
    by_key = {f"{r.run_id}/{r.call_id}": r for r in recent}
    exact = [k for k, r in by_key.items() if r.call_id == call_id]
    if len(exact) > 1:
        raise AmbiguousPrefix("call (in several runs: give --run)", call_id, exact)
    if exact:
        found = by_key[exact[0]]
    else:
        matches = [k for k, r in by_key.items() if r.call_id.startswith(call_id)]
        if len(matches) > 1:
            raise AmbiguousPrefix("call", call_id, matches)
        if not matches:
            raise CallNotFound(run_id, call_id)
        found = by_key[matches[0]]
    if raw:
        return client.get_call(found.call_id, run_id=found.run_id, include_raw=True)
    return found


def approval(client: Client, approval_id: str) -> str:
    """The pending approval's full id for `approval_id` or a unique prefix of it. A caller
    who may not list approvals gets its id as given: the decision itself is then refused
    with its own message (who may decide), not the listing's."""
    try:
        pending = [a.approval_id for a in client.approvals_pending()]
    except PermissionDenied:
        return approval_id
    return one("approval", approval_id, pending) or approval_id


def run_id(client: Client, prefix: str) -> str:
    """The run id `prefix` names: itself if a run or a call has it, else the one run id
    it is a unique prefix of (among the recorded runs and the recent calls' runs)."""
    ids = {r.run_id for r in client.runs.find(limit=1000)}
    ids |= {r.run_id for r in client.list_calls(limit=SCAN)}
    return one("run", prefix, ids) or prefix


def run_detail(client: Client, run: str) -> RunDetail:
    """The run as GetRun has it, or, for a run only calls used, built from its calls."""
    rid = run_id(client, run)
    try:
        return client.runs.get(rid)
    except RunNotFound:
        calls = client.list_calls(run_id=rid, limit=SCAN)
        if not calls:
            raise
    calls.sort(key=lambda c: c.created_at)
    owners = ", ".join(dict.fromkeys(c.agent for c in calls))
    info = RunInfo(
        run_id=rid,
        goal="",
        owner=owners,
        reason=NO_RECORD,
        created_at=calls[0].created_at,
        updated_at=max(_last(c) for c in calls),
    )
    return RunDetail(run=info, events=(), calls=tuple(calls))


def recorded(detail: RunDetail) -> bool:
    """Whether the Runs service has this run (not only calls made under its id)."""
    return not (detail.run.reason == NO_RECORD and not detail.events)


def _last(record: CallRecord) -> float:
    o = record.outcome
    return o.timeline[-1].at if o is not None and o.timeline else record.created_at
