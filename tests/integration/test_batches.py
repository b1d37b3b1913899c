"""Batches through the real daemon: conflicting calls start in proposal order across early
exits, a duplicate call id refuses the later call, and a disconnect cancels only its own
batch's calls. (Regression tests from a review of the scheduler integration, each of which
reproduced a bug since fixed; the review's idempotency tests are in test_idempotency.py,
its unit tests in unit/pipeline/test_idempotency_claim.py and unit/journal/test_writer.py.)"""

from __future__ import annotations

import uuid

import grpc

from execgate.client import Call, Client, EventKind, Status
from execgate.client import wire as cwire
from execgate.v1 import executor_pb2_grpc as pb_grpc
from tests.daemon import Daemon
from tests.support import Streamer, wait_until


def _run() -> str:
    return "rev-" + uuid.uuid4().hex[:10]


def _work(path: str, *, write: bool, seconds: float, call_id: str, key: str = "") -> Call:
    return Call(
        tool="work",
        arguments={"path": path, "write": write, "seconds": seconds},
        call_id=call_id,
        idempotency_key=key,
    )


# ---------------------------------------------------------------------------------------
# BUG 1: a call that ends before its turn (validation rejected, duplicate id) passes its
# turn at once, so the next call reaches the lock queue before earlier calls of the batch.


def test_rejected_call_lets_later_conflicting_call_overtake(client: Client) -> None:
    """c0 (`work`, analysed in a worker thread) and c2 (`write_file`, analysed inline) both
    write f.txt; c1 is rejected (unknown tool). Conflicting calls of a batch must start in
    proposal order, so c2 must wait for c0. Today c1 sets turns[1] immediately and c2
    takes the lock on f.txt before c0 has even asked for it."""
    run = _run()
    events = list(
        client.stream(
            [
                _work("f.txt", write=True, seconds=0.3, call_id="c0"),
                Call(tool="no_such_tool", arguments={}, call_id="c1"),
                Call(tool="write_file", arguments={"path": "f.txt", "content": "x"}, call_id="c2"),
            ],
            run_id=run,
        )
    )
    started = [e.call_id for e in events if e.kind is EventKind.STARTED]
    waiting = {e.call_id: e.blocked_by for e in events if e.kind is EventKind.WAITING}
    assert started == ["c0", "c2"], (started, waiting)
    assert "c0" not in waiting, waiting


def test_duplicate_call_id_in_batch_refuses_the_later_call(client: Client) -> None:
    """Two calls of a batch share id "c0". The later one (index 1) must be the one refused.
    Today the earlier `work` call is still validating in a worker thread when the noop
    (validated inline) registers (run, "c0") in Dispatcher._active, so the *first* proposed
    call is refused as the duplicate and the later one runs (dispatch.py:186)."""
    run = _run()
    events = list(
        client.stream(
            [
                _work("g.txt", write=True, seconds=0.1, call_id="c0"),
                Call(tool="noop", arguments={}, call_id="c0"),
            ],
            run_id=run,
        )
    )
    by_index = {e.index: e.outcome for e in events if e.kind is EventKind.FINISHED}
    assert by_index[1] is not None
    assert by_index[1].error_class == "duplicate_call_id"
    assert by_index[0] is not None
    assert by_index[0].status is Status.SUCCESS, (by_index[0].status, by_index[0].error_class)


# ---------------------------------------------------------------------------------------
# BUG 2: _abandon finds calls by (run_id, call_id) only, so a disconnecting batch cancels
# a *different* batch's queued call that happens to share a call id with one of its own.


def test_abandon_cancels_other_batchs_queued_call_with_same_id(daemon: Daemon) -> None:
    run = _run()
    # Batch A: a1 holds f.txt for a while, "x" queues behind it.
    a = Streamer(
        daemon.address,
        [
            _work("f.txt", write=True, seconds=1.5, call_id="a1"),
            Call(tool="write_file", arguments={"path": "f.txt", "content": "A"}, call_id="x"),
        ],
        run_id=run,
    )
    wait_until(lambda: a.seen(EventKind.WAITING, "x"), "x waiting")
    # Batch B (another connection): a long call, plus its own "x" (refused as duplicate).
    channel = grpc.insecure_channel(daemon.address)
    stub = pb_grpc.ExecutorStub(channel)
    req = cwire.execute_request(
        [
            _work("other.txt", write=True, seconds=3, call_id="b1"),
            Call(tool="noop", arguments={}, call_id="x"),
        ],
        run,
        "",
        False,
    )
    stream = stub.Execute(req)
    kinds = []
    for msg in stream:
        kinds.append((msg.call_id, msg.WhichOneof("kind")))
        if ("b1", "started") in kinds and ("x", "finished") in kinds:
            break
    stream.cancel()  # B disconnects: only B's queued calls may be cancelled
    channel.close()
    a.join(20)
    out = a.outcome("x")
    assert out.status is Status.SUCCESS, (out.status, out.error_class, out.message)
