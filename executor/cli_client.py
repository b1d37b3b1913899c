"""Client-side commands: tools, call, calls list|show, cancel, health."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import enum
import getpass
import json
import sys
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console
from rich.table import Table

from execgate.client import (
    Call,
    CallPlan,
    Client,
    DaemonUnavailable,
    Outcome,
    Status,
    TlsConfig,
)
from execgate.client._transport import sync_channel
from execgate.client.wire import resolve_address

from .local_identities import cli_token

STATUS_STYLE = {
    Status.SUCCESS: "green",
    Status.PARTIAL: "yellow",
    Status.FAILURE: "red",
    Status.REJECTED: "magenta",
    Status.UNKNOWN_OUTCOME: "bold red",
}


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--addr", help="daemon address (default: $EXECGATE_ADDR or unix:var/execgate.sock)"
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument(
        "--token", default=None, help="bearer token of your identity (default: $EXECGATE_TOKEN)"
    )
    common.add_argument("--tls-ca", type=Path, metavar="PEM", help="CA of the daemon's cert")
    common.add_argument("--tls-cert", type=Path, metavar="PEM", help="your client certificate")
    common.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")

    p = sub.add_parser("tools", parents=[common], help="list the daemon's tools")
    p.set_defaults(handler=_tools)

    p = sub.add_parser("call", parents=[common], help="run one tool call")
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
    p.add_argument("--call-id", default="")
    p.add_argument("--idempotency-key", default="")
    p.add_argument("--timeout", type=float, default=None, help="seconds")
    p.set_defaults(handler=_call)

    calls = sub.add_parser("calls", help="read the journal").add_subparsers(
        dest="calls_cmd", required=True
    )
    p = calls.add_parser("list", parents=[common], help="recent calls, newest first")
    p.add_argument("--run", default="")
    p.add_argument("--status", action="append", default=[], choices=[s.value for s in Status])
    p.add_argument("--tool", default="")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(handler=_calls_list)
    p = calls.add_parser("show", parents=[common], help="one call's full record")
    p.add_argument("call_id")
    p.add_argument("--run", default="")
    p.add_argument("--raw", action="store_true", help="include the raw result")
    p.set_defaults(handler=_calls_show)

    p = sub.add_parser("cancel", parents=[common], help="stop a call, a batch or a run")
    p.add_argument("--run", default="")
    p.add_argument("--call", default="")
    p.add_argument("--batch", default="")
    p.add_argument("--reason", default="cancelled from the CLI")
    p.add_argument("--grace", type=float, default=None)
    p.set_defaults(handler=_cancel)

    p = sub.add_parser(
        "explain", parents=[common], help="show how a batch would be scheduled, run nothing"
    )
    p.add_argument(
        "batch",
        help='a JSON file (or - for stdin): [{"tool": ..., "arguments": {...}, "call_id": ...}]',
    )
    p.add_argument("--run", default="")
    p.set_defaults(handler=_explain)

    p = sub.add_parser("health", parents=[common], help="exit 0 if the daemon is serving")
    p.set_defaults(handler=_health)

    from . import cli_approvals, cli_kills, cli_runs, cli_trace  # they import this module's helpers

    cli_approvals.add_commands(sub, common)
    cli_runs.add_commands(sub, common)
    cli_trace.add_commands(sub, common)
    cli_kills.add_commands(sub, common)


def _client(args: argparse.Namespace, *, run_id: str = "", identity: str = "agent") -> Client:
    """A client as --token, $EXECGATE_TOKEN, or else the local `identity`'s token beside
    the daemon's socket (`make run`'s, see local_identities): `agent` makes calls,
    `operator` decides approvals."""
    token = args.token
    if token is None:
        token = cli_token(resolve_address(args.addr), identity)
    return Client(args.addr, run_id=run_id, token=token, tls=_tls(args))


def _tls(args: argparse.Namespace) -> TlsConfig | None:
    given = (args.tls_ca, args.tls_cert, args.tls_key)
    if not any(given):
        return None
    if not all(given):
        raise SystemExit("execgate: --tls-ca, --tls-cert and --tls-key go together")
    return TlsConfig(args.tls_ca, args.tls_cert, args.tls_key)


def _tools(args: argparse.Namespace) -> int:
    with _client(args) as client:
        tools = client.list_tools()
    if args.json:
        _print_json([dataclasses.asdict(t) for t in tools])
        return 0
    table = Table("tool", "effects", "arguments", "description", title="execgate tools")
    for t in tools:
        effects = (
            "read-only" if t.read_only else "writes" + (", destructive" if t.destructive else "")
        )
        props = t.input_schema.get("properties", {})
        required = set(t.input_schema.get("required", []))
        names = ", ".join(n + ("" if n in required else "?") for n in props)
        table.add_row(t.name, effects, names, t.description.split(". ")[0])
    Console().print(table)
    return 0


def _call(args: argparse.Namespace) -> int:
    with _client(args, run_id=args.run) as client:
        arguments = _arguments(client, args)
        outcome = client.run(
            Call(
                tool=args.tool,
                arguments=arguments,
                call_id=args.call_id,
                idempotency_key=args.idempotency_key,
                timeout=args.timeout,
            )
        )
    if args.json:
        _print_json(_jsonable(outcome))
    else:
        _print_outcome(outcome)
    return 0 if outcome.status is Status.SUCCESS else 1


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


def _print_outcome(o: Outcome) -> None:
    console = Console(highlight=False)
    style = STATUS_STYLE[o.status]
    head = f"[{style}]{o.status.value.upper()}[/{style}]"
    if o.error_class != "none":
        head += f" {o.error_class}"
    if o.field:
        head += f" (field {o.field})"
    console.print(f"{head}  call {o.call_id}" + (f"  — {o.message}" if o.message else ""))
    if o.text:
        sys.stdout.write(o.text if o.text.endswith("\n") else o.text + "\n")
    if o.truncated:
        console.print(f"[yellow]… truncated: {o.returned_bytes} of {o.total_bytes} bytes[/yellow]")


def _calls_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        records = client.list_calls(
            run_id=args.run,
            statuses=[Status(s) for s in args.status],
            tool=args.tool,
            limit=args.limit,
        )
    if args.json:
        _print_json([_jsonable(r) for r in records])
        return 0
    table = Table("created", "run", "call", "tool", "status", "class", "ms")
    for r in records:
        o = r.outcome
        status = "running" if o is None else o.status.value
        ms = ""
        if o is not None and o.timeline:
            ms = f"{(o.timeline[-1].at - o.timeline[0].at) * 1000:.1f}"
        table.add_row(
            _when(r.created_at),
            r.run_id,
            r.call_id,
            r.tool,
            status,
            "" if o is None else o.error_class,
            ms,
        )
    Console().print(table)
    return 0


def _calls_show(args: argparse.Namespace) -> int:
    with _client(args) as client:
        record = client.get_call(args.call_id, run_id=args.run, include_raw=args.raw)
    data = _jsonable(record)
    if args.json:
        _print_json(data)
        return 0
    console = Console(highlight=False)
    for key in ("run_id", "call_id", "batch_id", "tool", "arguments_json", "agent", "may_write"):
        console.print(f"[bold]{key}[/bold]: {data[key]}")
    if record.awaiting_approval:
        who = ", ".join(record.approvers) or "an approver"
        console.print(
            f"[bold]state[/bold]: waiting for approval {record.awaiting_approval} "
            f"(decided by {who}; expires {_when(record.approval_expires_at or 0.0)})"
        )
        return 0
    if record.outcome is None:
        console.print("[bold]state[/bold]: running")
        return 0
    _print_outcome(record.outcome)
    for m in record.outcome.timeline:
        console.print(f"  {_when(m.at)}  {m.phase}" + (f"  {m.detail}" if m.detail else ""))
    if args.raw:
        console.print(f"[bold]raw_result[/bold]: {record.raw_result}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        hit = client.cancel(
            run_id=args.run,
            call_id=args.call,
            batch_id=args.batch,
            reason=args.reason,
            grace=args.grace,
            requester=f"cli user {getpass.getuser()}",
        )
    if args.json:
        _print_json({"cancelled": hit})
    else:
        print(f"cancel reached {len(hit)} call(s)" + (": " + ", ".join(hit) if hit else ""))
    return 0


def _explain(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.batch == "-" else Path(args.batch).read_text()
    try:
        calls = [Call(**item) for item in json.loads(text)]
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"execgate: {args.batch}: not a JSON list of calls: {exc}") from exc
    with _client(args, run_id=args.run) as client:
        plans = client.explain(calls)
    if args.json:
        _print_json([_jsonable(p) for p in plans])
        return 0
    table = Table(
        "#", "call", "tool", "writes", "resources", "waits for", "policy", title="lock plan"
    )
    for p in plans:
        if p.rejected is not None:
            what = f"REJECTED {p.rejected.error_class}: {p.rejected.message}"
            table.add_row(str(p.index), p.call_id, p.tool, "", what, "", _policy_cell(p))
            continue
        claims = "\n".join(f"{mode} {key}" for key, mode in p.claims)
        table.add_row(
            str(p.index),
            p.call_id,
            p.tool,
            "yes" if p.may_write else "no",
            claims,
            ", ".join(p.waits_for) or "-",
            _policy_cell(p),
        )
    Console().print(table)
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
    with sync_channel(address, _tls(args)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.UNAVAILABLE:  # nothing answers: exit 69, like the rest
                raise DaemonUnavailable(address, exc.details() or "") from exc
            print(f"execgate: not serving at {address}: {exc.code().name}", file=sys.stderr)
            return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    print("SERVING" if serving else health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    return 0 if serving else 1


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))
