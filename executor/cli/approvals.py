"""`execgate approvals list | watch | approve ID | deny ID --comment`: for approvers."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from execgate.client import Approval, ApprovalState

from . import common
from . import lookup as cli_lookup
from . import options as cli_options
from .table import Col, print_table

STATE_STYLE = {
    ApprovalState.PENDING: "yellow",
    ApprovalState.APPROVED: "green",
    ApprovalState.DENIED: "magenta",
    ApprovalState.EXPIRED: "red",
}


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = cli_options.common()
    approvals = sub.add_parser(
        "approvals", help="calls a policy `ask` rule parked: list, watch, approve, deny"
    ).add_subparsers(dest="approvals_cmd", required=True)
    p = approvals.add_parser("list", parents=[parent], help="pending approvals, oldest first")
    p.set_defaults(handler=_list)
    p = approvals.add_parser(
        "watch", parents=[parent], help="pending approvals, then each change as it happens"
    )
    p.set_defaults(handler=_watch)
    p = approvals.add_parser("approve", parents=[parent], help="let a parked call run")
    p.add_argument("approval_id", help="an approval id, or a unique prefix of one")
    p.add_argument("--comment", default="", help="recorded with the decision")
    p.set_defaults(handler=_approve)
    p = approvals.add_parser("deny", parents=[parent], help="refuse a parked call")
    p.add_argument("approval_id", help="an approval id, or a unique prefix of one")
    p.add_argument("--comment", required=True, help="why; the agent receives it")
    p.set_defaults(handler=_deny)


def _list(args: argparse.Namespace) -> int:
    with common.client(args, identity="operator") as client:
        pending = client.approvals_pending()
    if args.json:
        common.print_json([common.jsonable(a) for a in pending])
        return 0
    columns = [
        Col("approval", keep=True, style="bold"),
        Col("run", keep=True),
        Col("call", keep=True),
        Col("by"),
        Col("tool"),
        Col("arguments"),
        Col("rule"),
        Col("requested"),
        Col("expires"),
    ]
    rows = [
        [
            a.approval_id,
            a.run_id,
            a.call_id,
            a.requester,
            a.tool,
            a.arguments_json,
            f"{a.rule_id}: {a.reason}" if a.reason else a.rule_id,
            common.when(a.created_at),
            common.when(a.expires_at),
        ]
        for a in pending
    ]
    print_table(Console(highlight=False), columns, rows, title=f"pending approvals: {len(rows)}")
    return 0


def _watch(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    with common.client(args, identity="operator") as client:
        for a in client.watch_approvals():
            if args.json:
                print(json.dumps(common.jsonable(a), ensure_ascii=False), flush=True)
            else:
                console.print(_line(a))
    return 0


def _approve(args: argparse.Namespace) -> int:
    with common.client(args, identity="operator") as client:
        decided = client.approve(cli_lookup.approval(client, args.approval_id), args.comment)
    return _show(args, decided)


def _deny(args: argparse.Namespace) -> int:
    with common.client(args, identity="operator") as client:
        decided = client.deny(cli_lookup.approval(client, args.approval_id), args.comment)
    return _show(args, decided)


def _show(args: argparse.Namespace, a: Approval) -> int:
    if args.json:
        common.print_json(common.jsonable(a))
    else:
        Console(highlight=False).print(_line(a))
    return 0


def _line(a: Approval) -> str:
    style = STATE_STYLE[a.state]
    head = f"[{style}]{a.state.value.upper()}[/{style}] {a.approval_id}"
    what = f"{a.requester}: {a.tool} {a.arguments_json} (rule {a.rule_id}, run {a.run_id})"
    if a.state is ApprovalState.PENDING:
        return f"{head}  {what}  expires {common.when(a.expires_at)}"
    by = f" by {a.decided_by}" if a.decided_by else ""
    return f"{head}{by}  {what}" + (f"  — {a.comment}" if a.comment else "")
