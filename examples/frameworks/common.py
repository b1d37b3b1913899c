"""What the two framework examples share: a daemon serving this folder's tools, the same
tools run by the framework itself, and the report of a turn.

The tools are declared in tools.yaml beside this file: `increment` (read an integer from
a file, pause, write it plus one: a read-modify-write) and `peek` (print a file, slowly).
Run natively, a tool is the same program started in the workspace at once, as a
framework runs its local tools; through execgate, the daemon runs it in its sandbox,
scheduled by the effects the file declares.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from execgate.client import Event, EventKind

HERE = Path(__file__).resolve().parent
TOOLS = HERE / "tools.yaml"
POLICY = HERE / "policy.yaml"


def arguments(doc: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("-n", type=int, default=6, help="increments proposed in the turn (default 6)")
    p.add_argument(
        "--addr",
        default=None,
        help="a daemon serving tools.yaml and policy.yaml (default: start a private one)",
    )
    p.add_argument("--workspace", type=Path, default=None, help="that daemon's workspace")
    p.add_argument("--token", default=None, help="an agent's token for --addr")
    args = p.parse_args()
    if (args.addr is None) != (args.workspace is None):
        p.error("--addr and --workspace go together")
    return args


@contextlib.contextmanager
def daemon(args: argparse.Namespace) -> Iterator[tuple[str, Path]]:
    """(address, workspace): the daemon --addr names, or a private one in a temporary
    directory, stopped on exit."""
    if args.addr is not None:
        yield args.addr, args.workspace.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="execgate-example-") as tmp:
        root = Path(tmp)
        workspace = root / "workspace"
        workspace.mkdir()
        cmd = [
            sys.executable, "-m", "execgate.executor.cli", "serve",
            "--workspace", str(workspace), "--state-dir", str(root / "state"),
            "--tools", str(TOOLS), "--policy", str(POLICY),
        ]  # fmt: skip
        with (root / "daemon.log").open("wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for(root / "state" / "execgate.sock", proc, root / "daemon.log")
            yield f"unix:{root / 'state' / 'execgate.sock'}", workspace
        finally:
            proc.terminate()
            proc.wait(30)


def _wait_for(socket: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not socket.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the daemon did not start:\n" + log.read_text()[-2000:])
        time.sleep(0.05)


# ------------------------------------------------------------------ the tools, natively


@dataclass(frozen=True)
class Ran:
    """One tool call: which, and when it ran (time.time() seconds)."""

    call_id: str
    tool: str
    started: float
    finished: float


def argv(tool: str, **values: str) -> list[str]:
    """The program tools.yaml declares for `tool`, its `{name}` placeholders filled in."""
    [decl] = [t for t in yaml.safe_load(TOOLS.read_text())["tools"] if t["name"] == tool]
    return [element.format(**values) for element in decl["argv"]]


async def run_natively(workspace: Path, call_id: str, path: str, ran: list[Ran]) -> str:
    """What a framework does with a local tool: start it now, in the workspace. Its
    time goes to `ran`; its output is the result."""
    tool, started = tool_of(call_id), time.time()
    proc = await asyncio.create_subprocess_exec(
        *argv(tool, path=path), cwd=workspace, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    ran.append(Ran(call_id, tool, started, time.time()))
    return out.decode()


# ------------------------------------------------------------------ the report


def tool_of(call_id: str) -> str:
    """The examples' call ids say what they call: inc0, inc1, ..., peek0, ..."""
    return "increment" if call_id.startswith("inc") else "peek"


class Timeline:
    """An `on_event` hook keeping the daemon's own marks of each call that finished."""

    def __init__(self) -> None:
        self.ran: list[Ran] = []

    def __call__(self, event: Event) -> None:
        if event.kind is not EventKind.FINISHED or event.outcome is None:
            return
        started, finished = event.outcome.mark("started"), event.outcome.mark("finished")
        if started is not None and finished is not None:
            self.ran.append(Ran(event.call_id, tool_of(event.call_id), started.at, finished.at))


def counter(workspace: Path, name: str) -> Path:
    path = workspace / name
    path.write_text("0\n")
    path.chmod(0o666)  # whoever the sandbox runs the command as may write it
    return path


def notes(workspace: Path) -> None:
    (workspace / "notes.txt").write_text("the notes the peeks read\n")


def overlap(a: Ran, b: Ran) -> bool:
    return a.started < b.finished and b.started < a.finished


def report(title: str, n: int, path: Path, ran: list[Ran]) -> int:
    """Print what the turn did to the counter and how its calls overlapped; the number
    of updates lost."""
    lost = n - int(path.read_text())
    incs = [r for r in ran if r.tool == "increment"]
    peeks = [r for r in ran if r.tool == "peek"]
    t0 = min(r.started for r in ran)
    print(title)
    print(f"  {path.name}: 0 -> {path.read_text().strip()} after {n} increments: {lost} lost")
    inc_pairs = sum(overlap(a, b) for i, a in enumerate(incs) for b in incs[i + 1 :])
    print(f"  increments running at the same time as another: {inc_pairs} pair(s)")
    together = max(p.started for p in peeks) < min(p.finished for p in peeks)
    print(f"  the {len(peeks)} peeks of notes.txt ran together: {'yes' if together else 'no'}")
    for r in sorted(ran, key=lambda r: r.started):
        bar = " " * round((r.started - t0) * 20) + "#" * max(
            1, round((r.finished - r.started) * 20)
        )
        print(f"    {r.call_id:<8} {r.tool:<9} {r.started - t0:6.2f}-{r.finished - t0:5.2f}s {bar}")
    return lost
