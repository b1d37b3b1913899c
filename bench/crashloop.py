"""Kill -9 loop: every outcome a client was told survives a daemon killed mid-write.

Each round starts the daemon (the same state directory every round: the journal
accumulates), lets `--clients` clients send durable `write_file` calls as fast as
they can -- each client its own file, and every fourth call a file in a directory
that does not exist yet --, kills the daemon with SIGKILL after a random moment,
restarts it, and checks, through GetCall on the restarted daemon:

- every outcome a client received is in the journal exactly as reported (the whole
  Outcome message: status, class, message, evidence, timeline);
- every call sent but never answered is either absent (it never started), finished
  with a real outcome (it ended; its reply was lost in the kill), or
  UNKNOWN_OUTCOME/interrupted with the `recovered` mark; none is left running, none
  marked done without having ended;
- nothing a call wrote is visible without its journal row: each client's file holds
  the content of a call that has a row and is not older than its last reported
  SUCCESS, a directory made for a call exists only if that call has a row, and a
  leftover temp file belongs to a client with an interrupted call.

It kills the daemon, not the machine: the page cache survives, so what it proves is
the order of the daemon's steps (journal before report, intent before any visible
effect), not the fsyncs themselves (docs/architecture.md, "The durable write path").
The exit status is non-zero when any check fails.

    python bench/crashloop.py                  # 20 rounds, 8 clients
    python bench/crashloop.py --rounds 100 --clients 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/crashloop.py` puts bench/ first, not the repo
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from execgate.v1 import executor_pb2 as pb  # noqa: E402
from execgate.v1 import executor_pb2_grpc as pb_grpc  # noqa: E402
from tests.daemon import Daemon  # noqa: E402

PAD = "x" * 200  # each write's content: its call id, then this


@dataclass
class Client:
    """One client's calls in one round, in the order it sent them."""

    index: int
    sent: list[str] = field(default_factory=list)
    told: dict[str, pb.Outcome] = field(default_factory=dict)
    # Temp files beside its file before the round (an earlier round's interrupted call).
    litter_before: set[str] = field(default_factory=set)

    def path(self, call_id: str) -> str:
        if _in_new_dir(call_id):
            return f"crash/new-{call_id}/f.txt"
        return f"crash/c{self.index:02d}.txt"


def temp_files(workspace: Path, index: int) -> set[str]:
    return {p.name for p in (workspace / "crash").glob(f".c{index:02d}.txt.execgate-*.tmp")}


def _in_new_dir(call_id: str) -> bool:
    return int(call_id.rsplit("-", 1)[1]) % 4 == 3


def content(call_id: str) -> str:
    return f"{call_id}\n{PAD}\n"


async def send(stub: pb_grpc.ExecutorStub, run_id: str, client: Client, stop: float) -> None:
    """Sequential writes until the daemon dies (or `stop`, monotonic, passes)."""
    i = 0
    while time.monotonic() < stop:
        call_id = f"r{run_id}-c{client.index:02d}-{i}"
        i += 1
        args = {"path": client.path(call_id), "content": content(call_id)}
        request = pb.ExecuteRequest(
            run_id=run_id,
            outcomes_only=True,
            calls=[
                pb.ToolCall(call_id=call_id, tool="write_file", arguments_json=json.dumps(args))
            ],
        )
        client.sent.append(call_id)
        try:
            events = [e async for e in stub.Execute(request, timeout=30)]
        except grpc.RpcError:
            return  # the daemon was killed: this call's fate is the journal's to tell
        for event in events:
            if event.HasField("finished"):
                client.told[call_id] = event.finished.outcome


async def round_(daemon: Daemon, run_id: str, clients: int, kill_after: float) -> list[Client]:
    group = [Client(c, litter_before=temp_files(daemon.workspace, c)) for c in range(clients)]
    async with grpc.aio.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.ExecutorStub(channel)
        senders = [send(stub, run_id, c, time.monotonic() + 60) for c in group]

        async def killer() -> None:
            await asyncio.sleep(kill_after)
            daemon.kill_group()  # SIGKILL, as a crash

        await asyncio.gather(killer(), *senders)
    return group


@dataclass
class Tally:
    sent: int = 0
    told: int = 0
    absent: int = 0
    ended_untold: int = 0
    recovered: int = 0
    problems: list[str] = field(default_factory=list)


async def check(daemon: Daemon, run_id: str, group: list[Client], tally: Tally) -> None:
    async with grpc.aio.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.ExecutorStub(channel)
        for client in group:
            rows: dict[str, pb.CallRecord] = {}
            for call_id in client.sent:
                row = await _get(stub, run_id, call_id)
                if row is not None:
                    rows[call_id] = row
                _check_call(call_id, client.told.get(call_id), row, tally)
            _check_files(daemon.workspace, client, rows, tally)


async def _get(stub: pb_grpc.ExecutorStub, run_id: str, call_id: str) -> pb.CallRecord | None:
    try:
        return await stub.GetCall(pb.GetCallRequest(run_id=run_id, call_id=call_id), timeout=30)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


def _check_call(call_id: str, told: pb.Outcome | None, row: pb.CallRecord | None, t: Tally) -> None:
    t.sent += 1
    if told is not None:
        t.told += 1
        if row is None:
            t.problems.append(f"{call_id}: told {_name(told)}, but not in the journal")
        elif row.outcome != told:
            t.problems.append(f"{call_id}: told {_name(told)}, journal says {_name(row.outcome)}")
        return
    if row is None:
        t.absent += 1
        return
    if row.state != pb.CALL_STATE_FINISHED:
        t.problems.append(f"{call_id}: left {pb.CallState.Name(row.state)} after recovery")
    elif row.outcome.error_class == pb.ERROR_CLASS_INTERRUPTED:
        recovered = any(m.phase == pb.PHASE_RECOVERED for m in row.outcome.timeline)
        if row.outcome.status != pb.OUTCOME_STATUS_UNKNOWN_OUTCOME or not recovered:
            t.problems.append(f"{call_id}: interrupted write recovered as {_name(row.outcome)}")
        t.recovered += 1
    else:
        t.ended_untold += 1  # it ended and was journaled; the kill took its reply


def _check_files(workspace: Path, client: Client, rows: dict[str, pb.CallRecord], t: Tally) -> None:
    """Nothing visible without a row; nothing older than what was reported."""
    own = [c for c in client.sent if not _in_new_dir(c)]
    target = workspace / client.path(own[0]) if own else None
    if target is not None and target.exists():
        holder = target.read_text().split("\n", 1)[0]
        if holder in client.sent and holder not in rows:
            t.problems.append(f"{target.name} holds {holder}'s write, which has no journal row")
        last_success = max(
            (own.index(c) for c in own if _succeeded(client.told.get(c))), default=-1
        )
        if holder in own and own.index(holder) < last_success:
            t.problems.append(f"{target.name} holds {holder}, older than a reported SUCCESS")
    for call_id in client.sent:
        made = _in_new_dir(call_id) and (workspace / client.path(call_id)).parent.exists()
        if made and call_id not in rows:
            t.problems.append(f"{call_id}'s new directory exists without a journal row")
    interrupted = any(r.outcome.error_class == pb.ERROR_CLASS_INTERRUPTED for r in rows.values())
    litter = temp_files(workspace, client.index) - client.litter_before
    if litter and not interrupted:
        t.problems.append(f"temp files {sorted(litter)} without an interrupted call")


def _succeeded(outcome: pb.Outcome | None) -> bool:
    return outcome is not None and outcome.status == pb.OUTCOME_STATUS_SUCCESS


def _name(outcome: pb.Outcome) -> str:
    return f"{pb.OutcomeStatus.Name(outcome.status)}/{pb.ErrorClass.Name(outcome.error_class)}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--min-kill", type=float, default=0.3, help="earliest kill, s after start")
    p.add_argument("--max-kill", type=float, default=1.5, help="latest kill, s after start")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--tmp", type=Path, default=None, help="where the daemon's state goes")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="eg-crash-", dir=args.tmp))
    daemon = Daemon(root)
    tally = Tally()
    print(f"kill -9 loop: {args.rounds} rounds, {args.clients} clients, seed {seed}, in {root}")
    for r in range(args.rounds):
        daemon.start()
        (daemon.workspace / "crash").mkdir(exist_ok=True)
        kill_after = rng.uniform(args.min_kill, args.max_kill)
        run_id = f"{r}"
        group = asyncio.run(round_(daemon, run_id, args.clients, kill_after))
        daemon.start()  # recovery runs before it serves
        before = len(tally.problems)
        asyncio.run(check(daemon, run_id, group, tally))
        daemon.stop()
        sent, told = sum(len(c.sent) for c in group), sum(len(c.told) for c in group)
        print(
            f"  round {r + 1}: killed after {kill_after:.2f}s; sent {sent}, told {told}; "
            f"problems {len(tally.problems) - before}",
            flush=True,
        )
    print(
        f"\n{tally.sent} calls sent, {tally.told} outcomes told (each in the journal as told: "
        f"{'yes' if not any('told' in p for p in tally.problems) else 'NO'}); untold: "
        f"{tally.absent} never started, {tally.ended_untold} ended (reply lost), "
        f"{tally.recovered} recovered UNKNOWN_OUTCOME/interrupted"
    )
    for problem in tally.problems:
        print(f"  PROBLEM: {problem}")
    print("PASS" if not tally.problems else f"FAIL: {len(tally.problems)} problems")
    return 0 if not tally.problems else 1


if __name__ == "__main__":
    sys.exit(main())
