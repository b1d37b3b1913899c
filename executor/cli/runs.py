"""`execgate runs list | show RUN | cancel RUN`: agent loops as the daemon records them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from execgate.client import RunDetail, RunInfo
from execgate.client.loop.states import State

from . import common
from . import lookup as cli_lookup
from . import options as cli_options
from .table import Col, print_table

STATE_STYLE = {
    State.COMPLETED: "green",
    State.FAILED: "red",
    State.CANCELLED: "magenta",
    State.BUDGET_EXHAUSTED: "yellow",
    State.EXPIRED: "yellow",
    State.ESCALATED: "bold yellow",
}


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = cli_options.common()
    runs = sub.add_parser(
        "runs", help="agent loops recorded by the daemon: list, show, cancel"
    ).add_subparsers(dest="runs_cmd", required=True)
    p = runs.add_parser("list", parents=[parent], help="runs, newest first")
    p.add_argument("--state", action="append", default=[], help="a state, or 'active' (repeatable)")
    p.add_argument("--owner", default="", help="only this identity's runs (default: any)")
    p.add_argument("--limit", type=int, default=50, help="at most this many runs")
    p.set_defaults(handler=_list)
    p = runs.add_parser("show", parents=[parent], help="a run's transitions and calls")
    p.add_argument(
        "run_id", help="a run id (or a unique prefix): any run calls used, `default` included"
    )
    p.set_defaults(handler=_show)
    p = runs.add_parser("cancel", parents=[parent], help="ask a run to stop")
    p.add_argument("run_id", help="the run's id")
    p.add_argument("--reason", default="cancelled from the CLI", help="recorded with the cancel")
    p.set_defaults(handler=_cancel)


def _list(args: argparse.Namespace) -> int:
    with common.client(args) as client:
        runs = client.runs.find(states=args.state, owner=args.owner, limit=args.limit)
    if args.json:
        common.print_json([common.jsonable(r) for r in runs])
        return 0
    columns = [
        Col("run", keep=True, style="bold"),
        Col("state", keep=True),
        Col("owner"),
        Col("events", justify="right"),
        Col("reason"),
        Col("goal"),
        Col("created"),
    ]
    rows = [
        [
            r.run_id,
            r.state.value,
            r.owner,
            str(r.last_seq),
            r.reason,
            _short(r.goal),
            common.when_short(r.created_at),
        ]
        for r in runs
    ]
    print_table(Console(highlight=False), columns, rows, title=f"runs: {len(rows)}")
    return 0


def _show(args: argparse.Namespace) -> int:
    with common.client(args) as client:
        detail = cli_lookup.run_detail(client, args.run_id)
    if args.json:
        common.print_json(common.jsonable(detail))
        return 0
    _print_detail(detail)
    return 0


def _print_detail(detail: RunDetail) -> None:
    run = detail.run
    console = Console(highlight=False)
    console.print(f"run {escape(run.run_id)}  owner {escape(run.owner)}  model {run.model or '-'}")
    if not cli_lookup.recorded(detail):
        console.print(
            "no run record: these calls used the run id without the Runs service "
            "(an agent calling Execute directly, or the implicit default run)"
        )
    else:
        console.print(f"goal: {escape(run.goal)}")
        console.print(f"workspace: {escape(run.workspace)}")
        console.print(f"state: {_state(run)}  ({escape(run.reason)})")
    if run.limits:
        console.print("limits: " + ", ".join(f"{k} {v}" for k, v in run.limits.items()))
    for line in _backing(detail):
        console.print(line, markup=False)
    if run.cancel is not None:
        ask = run.cancel
        console.print(f"cancel requested by {ask.requester} at {common.when(ask.at)}: {ask.reason}")
    if detail.events:
        _print_events(console, detail)
    columns = [
        Col("call", keep=True, style="bold"),
        Col("status", keep=True),
        Col("tool"),
        Col("class"),
    ]
    rows = []
    for c in detail.calls:
        o = c.outcome
        status = "running" if o is None else o.status.value
        rows.append([c.call_id, status, c.tool, "" if o is None else o.error_class])
    print_table(console, columns, rows, title=f"calls: {len(rows)}")


def _print_events(console: Console, detail: RunDetail) -> None:
    start = detail.events[0].at
    columns = [Col("seq", justify="right"), Col("+s"), Col("from → to"), Col("reason"), Col("what")]
    rows = [
        [
            str(e.seq),
            f"{e.at - start:.3f}",
            f"{e.from_state.value} → {e.to_state.value}",
            e.reason,
            _gist(e.data),
        ]
        for e in detail.events
    ]
    print_table(console, columns, rows, title="transitions")


def _cancel(args: argparse.Namespace) -> int:
    with common.client(args) as client:
        run = client.runs.cancel(args.run_id, args.reason)
    if args.json:
        common.print_json(common.jsonable(run))
        return 0
    c = run.cancel
    who = f" by {c.requester} at {common.when(c.at)}" if c is not None else ""
    print(f"run {run.run_id}: cancel requested{who}; state now {run.state.value}")
    return 0


def _gist(data: dict[str, Any]) -> str:
    """One line of what a transition carries (`runs show --json` has all of it)."""
    if "turn" in data:
        turn = data["turn"]
        calls = [f"{c['name']}({_short(json.dumps(c['arguments']), 30)})" for c in turn["calls"]]
        return "calls " + ", ".join(calls) if calls else "answer: " + _short(turn["text"])
    if "calls" in data:
        return "sent " + ", ".join(f"{c['call_id']} {c['tool']}" for c in data["calls"])
    if "answer" in data:
        return f"{len(data.get('actions', []))} action(s); answer: " + _short(str(data["answer"]))
    if "results" in data:
        return ", ".join(f"{r['call_id']} {r['status']}" for r in data["results"])
    if "rule" in data:
        figures = data.get("figures", {})
        return f"rule {data['rule']}; steps {figures.get('steps')}, {figures.get('elapsed_s')}s"
    if "finding" in data:
        return "verifier: " + _short(str(data["finding"]))
    return _short(json.dumps(data, sort_keys=True)) if data else ""


def _backing(detail: RunDetail) -> list[str]:
    """A completion's backing: which verifier accepted it (or "unverified"), and caveats."""
    if detail.run.state is not State.COMPLETED or not detail.events:
        return []
    data = detail.events[-1].data
    check = data.get("verification")
    if not isinstance(check, dict):
        return []
    if check.get("verified"):
        line = f"backing: verified by {check.get('verifier')}"
        line += f": {check['finding']}" if check.get("finding") else ""
    else:
        line = "backing: unverified (no verifier ran)"
    return [line] + [f"caveat: {c}" for c in data.get("caveats", [])]


def _state(run: RunInfo) -> str:
    style = STATE_STYLE.get(run.state)
    return f"[{style}]{run.state.value}[/{style}]" if style else run.state.value


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
