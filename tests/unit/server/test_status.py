"""The one table from daemon errors to gRPC statuses (executor/server/status.py)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import grpc
import pytest

from execgate.executor.core.errors import MalformedRequest
from execgate.executor.core.fanout import Lagging
from execgate.executor.pipeline.approve import ApprovalError, Refused
from execgate.executor.pipeline.inflight import NotYours
from execgate.executor.runs.registry import Closing, Refusal, RunRefused
from execgate.executor.server import status
from execgate.executor.server.status import (
    CLASS_KEY,
    FIELD_KEY,
    BadArgument,
    CallNotFound,
    OutcomesDetached,
    OutcomesUnrecorded,
    PermissionDenied,
    Unauthenticated,
    abort_for,
)

Code = grpc.StatusCode
SERVER = Path(status.__file__).parent


class Aborted(Exception):
    pass


class Context:
    """What abort_for needs of a ServicerContext; records what it was told."""

    async def abort(self, code: grpc.StatusCode, details: str, **kw: Any) -> None:
        raise Aborted(code, details, kw.get("trailing_metadata", ()))


def _ended(exc: BaseException, method: str = "/execgate.v1.Executor/GetCall") -> tuple[Any, ...]:
    with pytest.raises(Aborted) as caught:
        asyncio.run(abort_for(Context(), exc, method))  # type: ignore[arg-type]
    return caught.value.args


@pytest.mark.parametrize(
    ("exc", "code", "details", "trailers"),
    [
        (
            MalformedRequest("too_large", "calls", "calls: too many"),
            Code.INVALID_ARGUMENT,
            "too_large: calls: too many",
            ((CLASS_KEY, "too_large"), (FIELD_KEY, "calls")),
        ),
        (
            RunRefused(Refusal.EXISTS, "run 'r' exists", "run_id"),
            Code.ALREADY_EXISTS,
            "exists: run_id: run 'r' exists",
            ((CLASS_KEY, "exists"), (FIELD_KEY, "run_id")),
        ),
        (
            RunRefused(Refusal.GAP, "seq 3 after 1", "events"),
            Code.FAILED_PRECONDITION,
            "gap: events: seq 3 after 1",
            ((CLASS_KEY, "gap"), (FIELD_KEY, "events")),
        ),
        (
            ApprovalError(Refused.NOT_PENDING, "already approved"),
            Code.FAILED_PRECONDITION,
            "already approved",
            (),
        ),
        (NotYours("bob", "bob may cancel only its own"), Code.PERMISSION_DENIED, None, ()),
        (
            Lagging(8),
            Code.RESOURCE_EXHAUSTED,
            "the watcher fell more than 8 updates behind; watch again",
            (),
        ),
        (Closing("r"), Code.UNAVAILABLE, "the daemon is stopping; run 'r' is still open", ()),
        (Unauthenticated("no credentials"), Code.UNAUTHENTICATED, "no credentials", ()),
        (PermissionDenied("ci may not"), Code.PERMISSION_DENIED, "ci may not", ()),
        (CallNotFound("default", "c1"), Code.NOT_FOUND, "no call 'c1' in run 'default'", ()),
        (BadArgument("tool", "tool: required"), Code.INVALID_ARGUMENT, "tool: required", ()),
        (OutcomesUnrecorded(["c1", "c2"]), Code.INTERNAL, None, ()),
        (OutcomesDetached([("c1", "a1")]), Code.UNAVAILABLE, None, ()),
        (
            NotImplementedError(),
            Code.UNIMPLEMENTED,
            "/execgate.v1.Executor/GetCall is not implemented",
            (),
        ),
        (
            KeyError("secret"),
            Code.INTERNAL,
            "internal error in GetCall (KeyError); see the daemon log",
            ((CLASS_KEY, "internal"),),
        ),
    ],
)
def test_each_error_ends_its_rpc_with_its_status(
    exc: BaseException, code: grpc.StatusCode, details: str | None, trailers: tuple[Any, ...]
) -> None:
    got_code, got_details, got_trailers = _ended(exc)
    assert got_code is code
    assert got_details == (str(exc) if details is None else details)
    assert got_trailers == trailers


def test_a_subclass_takes_its_nearest_listed_base() -> None:
    class Stricter(NotYours):
        pass

    assert status.rule_for(Stricter("a", "b")) is status.RULES[NotYours]
    assert status.rule_for(RuntimeError()) is status.INTERNAL


def test_a_refusal_knows_its_code() -> None:
    assert Unauthenticated("x").code is Code.UNAUTHENTICATED
    assert PermissionDenied("x").code is Code.PERMISSION_DENIED


def test_no_other_server_module_picks_a_status_code() -> None:
    """The table is the only place a code is chosen: no `StatusCode.X` elsewhere."""
    pickers = [
        path.name
        for path in sorted(SERVER.glob("*.py"))
        if path.name != "status.py" and re.search(r"StatusCode\.[A-Z]", path.read_text())
    ]
    assert pickers == []
