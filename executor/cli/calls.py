"""Client-side commands: call, calls list|show, cancel, health."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console

from execgate.client import (
    Call,
    CallPlan,
    Client,
    DaemonUnavailable,
    Status,
)
from execgate.client._transport import sync_channel
from execgate.client.wire import resolve_address

from . import common
from . import lookup as cli_lookup
from . import options as cli_options
from . import show as cli_show
from .call import run_call
from .table import Col, print_table

WORKSPACE_HELP = (
    "the workspace the call works in: one the policy gives this identity "
    "(default: its run's, else its first)"
)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = cli_options.common()

    p = sub.add_parser("call", parents=[parent], help="run one tool call")
    p.add_argument("tool")
    p.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="K=V",
        help="an argument; V is taken as JSON unless the tool's schema wants a string",
    )
    p.add_argument("--args-json", default=None, help="all arguments as one JSON object")
    p.add_argument("--run", default="", help="run id (default: the implicit run)")
    p.add_argument("--workspace", default="", help=WORKSPACE_HELP)
    p.add_argument("--call-id", default="", help="the call's id (default: the client makes one)")
    p.add_argument("--idempotency-key", default="", help="replays the first outcome under this key")
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds (default: the policy's or daemon's)"
    )
    p.add_argument(
        "--progress-every",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="while it waits or runs, say so on stderr this often (0: only at each change)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(handler=_call)

    calls = sub.add_parser("calls", help="read the journal").add_subparsers(
        dest="calls_cmd", required=True
    )
    p = calls.add_parser("list", parents=[parent], help="recent calls, newest first")
    p.add_argument("--run", default="", help="only this run's calls (default: every run)")
    p.add_argument(
        "--status",
        action="append",
        default=[],
        choices=[s.value for s in Status],
        help="only calls that ended so; repeatable (default: any)",
    )
    p.add_argument("--tool", default="", help="only this tool's calls (default: any)")
    p.add_argument("--workspace", default="", help="only calls in this workspace (default: any)")
    p.add_argument("--limit", type=int, default=50, help="at most this many calls")
    p.set_defaults(handler=_calls_list)
    p = calls.add_parser("show", parents=[parent], help="one call's full record")
    p.add_argument("call_id", help="a call id, or a unique prefix of one")
    p.add_argument("--run", default="", help="the call's run (default: any run)")
    p.add_argument("--raw", action="store_true", help="include the raw result")
    p.set_defaults(handler=_calls_show)

    p = sub.add_parser("cancel", parents=[parent], help="stop a call, a batch or a run")
    p.add_argument("--run", default="", help="every call of this run")
    p.add_argument("--call", default="", help="this call (an id or a unique prefix)")
    p.add_argument("--batch", default="", help="every call of this batch")
    p.add_argument("--reason", default="cancelled from the CLI", help="recorded with the cancel")
    p.add_argument(
        "--grace",
        type=float,
        default=None,
        help="seconds between SIGTERM and SIGKILL (default: the call's own)",
    )
    p.set_defaults(handler=_cancel)

    p = sub.add_parser(
        "explain", parents=[parent], help="show how a batch would be scheduled, run nothing"
    )
    p.add_argument(
        "batch",
        help='a JSON file (or - for stdin): [{"tool": ..., "arguments": {...}, "call_id": ...}]',
    )
    p.add_argument("--run", default="", help="run id (default: the implicit run)")
    p.add_argument("--workspace", default="", help=WORKSPACE_HELP)
    p.set_defaults(handler=_explain)

    p = sub.add_parser("health", parents=[parent], help="exit 0 if the daemon is serving")
    p.set_defaults(handler=_health)


def _call(args: argparse.Namespace) -> int:

    with common.client(args, run_id=args.run, workspace=args.workspace) as client:
        return run_call(args, client, _arguments(client, args))


def _arguments(client: Client, args: argparse.Namespace) -> dict[str, Any] | str:
    if args.args_json is not None:
        return str(args.args_json)
    if not args.arg:
        return {}
    schema = next((t.input_schema for t in client.list_tools() if t.name == args.tool), {})
    props = schema.get("properties", {})
    result: dict[str, Any] = {}
    for item in args.arg:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"execgate: --arg {item!r} is not K=V")
        result[key] = value if props.get(key, {}).get("type") == "string" else _json_or_text(value)
    return result


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _calls_list(args: argparse.Namespace) -> int:
    with common.client(args) as client:
        records = client.list_calls(
            run_id=args.run,
            statuses=[Status(s) for s in args.status],
            tool=args.tool,
            limit=args.limit,
            workspace=args.workspace,
        )
    if args.json:
        common.print_json([common.jsonable(r) for r in records])
        return 0
    columns = [
        Col("call", keep=True, style="bold"),
        Col("run", keep=True),
        Col("status", keep=True),
        Col("tool"),
        Col("class"),
        Col("ms", justify="right"),
        Col("workspace"),
        Col("created"),
    ]
    rows = []
    for r in records:
        o = r.outcome
        ms = ""
        if o is not None and o.timeline:
            ms = f"{(o.timeline[-1].at - o.timeline[0].at) * 1000:.1f}"
        rows.append(
            [
                r.call_id,
                r.run_id,
                "running" if o is None else o.status.value,
                r.tool,
                "" if o is None else o.error_class,
                ms,
                r.workspace or "-",
                common.when_short(r.created_at),
            ]
        )
    print_table(Console(highlight=False), columns, rows, title=f"calls: {len(rows)}")
    return 0


def _calls_show(args: argparse.Namespace) -> int:
    with common.client(args) as client:
        record = cli_lookup.call(client, args.call_id, args.run, raw=args.raw)
    if args.json:
        common.print_json(common.jsonable(record))
        return 0
    cli_show.print_record(Console(highlight=False), record, raw=args.raw)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with common.client(args) as client:
        run_id, call_id = args.run, args.call
        if call_id:
            record = cli_lookup.call(client, call_id, run_id)
            run_id, call_id = record.run_id, record.call_id
        hit = client.cancel(
            run_id=run_id,
            call_id=call_id,
            batch_id=args.batch,
            reason=args.reason,
            grace=args.grace,
            requester=f"cli user {getpass.getuser()}",
        )
    where = run_id or cli_lookup.DEFAULT_RUN
    if args.json:
        common.print_json({"run_id": where, "cancelled": hit})
    else:
        reached = ": " + ", ".join(hit) if hit else ""
        print(f"cancel reached {len(hit)} call(s) of run {where}{reached}")
    return 0


def _explain(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.batch == "-" else Path(args.batch).read_text()
    try:
        calls = [Call(**item) for item in json.loads(text)]
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"execgate: {args.batch}: not a JSON list of calls: {exc}") from exc
    with common.client(args, run_id=args.run, workspace=args.workspace) as client:
        plans = client.explain(calls)
    if args.json:
        common.print_json([common.jsonable(p) for p in plans])
        return 0
    columns = [
        Col("#", justify="right", min_width=2),
        Col("call", keep=True, style="bold"),
        Col("tool", keep=True),
        Col("writes", min_width=3),
        Col("resources"),
        Col("waits for"),
        Col("policy"),
    ]
    rows = []
    for p in plans:
        if p.rejected is not None:
            what = f"REJECTED {p.rejected.error_class}: {p.rejected.message}"
            rows.append([str(p.index), p.call_id, p.tool, "", what, "", _policy_cell(p)])
            continue
        claims = "\n".join(f"{mode} {key}" for key, mode in p.claims)
        rows.append(
            [
                str(p.index),
                p.call_id,
                p.tool,
                "yes" if p.may_write else "no",
                claims,
                ", ".join(p.waits_for) or "-",
                _policy_cell(p),
            ]
        )
    print_table(Console(highlight=False), columns, rows, title="lock plan")
    return 0


def _policy_cell(plan: CallPlan) -> str:
    """`allow (rule)`, `deny (rule)`, or `ask (rule): needs approval from …`."""
    d = plan.policy
    if d is None:
        return ""
    cell = f"{d.effect} ({', '.join(d.rule_ids) or 'default'})"
    if plan.needs_approval:
        cell += f": needs approval from {', '.join(d.approvers)}"
    return cell


def _health(args: argparse.Namespace) -> int:
    address = resolve_address(args.addr)
    # Health needs no credentials, but a TLS listener still needs the TLS handshake.
    with sync_channel(address, common.tls(args)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.UNAVAILABLE:  # nothing answers: exit 69, like the rest
                raise DaemonUnavailable(address, exc.details() or "") from exc
            print(f"execgate: not serving at {address}: {exc.code().name}", file=sys.stderr)
            return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if args.json:
        common.print_json({"address": address, "status": status, "serving": serving})
    else:
        print(status)
    return 0 if serving else 1
