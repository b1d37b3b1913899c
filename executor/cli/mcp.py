"""`execgate mcp`: the daemon's tools as an MCP server, over stdio (what MCP clients
launch) or streamable HTTP on loopback (`--http 127.0.0.1:PORT`).

The bridge is a client of the daemon like any agent (execgate.client.mcpbridge); this
module only parses the options. It needs the `mcp` SDK (`pip install 'execgate[mcp]'`),
not the daemon extra: nothing here imports the daemon, the CLI's shared helpers
(common.py, which reads identities files) included.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from . import options as cli_options

# The top-level modules the `mcp` extra brings; one missing means an install without it.
MCP_EXTRA = frozenset({"mcp", "mcp_types", "uvicorn", "starlette", "anyio", "pydantic"})


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "mcp",
        help="serve the daemon's tools to MCP clients (stdio, or HTTP on loopback)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--addr", help="daemon address (default: $EXECGATE_ADDR or unix:var/execgate.sock)"
    )
    p.add_argument(
        "--token",
        default=None,
        help="the bridge's bearer token (default: $EXECGATE_TOKEN, else the agent token "
        "beside a local daemon's socket)",
    )
    p.add_argument("--tls-ca", type=Path, metavar="PEM", help="CA of the daemon's cert")
    p.add_argument("--tls-cert", type=Path, metavar="PEM", help="the bridge's client certificate")
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")
    p.add_argument(
        "--run-id",
        default="",
        help="the run every call goes to (default: mcp-<session>, one run per MCP session)",
    )
    p.add_argument(
        "--workspace",
        default="",
        metavar="NAME",
        help="the workspace every call works in: one the policy gives the bridge's identity "
        "(default: its run's, else its first); one not given is refused call by call",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a call the client cancels gets to stop before it is killed "
        "(default: the daemon's)",
    )
    p.add_argument(
        "--heartbeat",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="while a call waits for a lock or an approver, say so again this often "
        "(progress notifications, to clients that asked for them)",
    )
    p.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio; HOST must be "
        "a loopback address (PORT 0: any free port, printed on stderr)",
    )
    p.add_argument("--verbose", action="store_true", help="log each cancel and session on stderr")
    p.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    if not 0 < args.heartbeat < float("inf"):
        raise SystemExit(f"execgate: --heartbeat {args.heartbeat}: must be a positive number")
    if args.grace is not None and not 0 <= args.grace < float("inf"):
        raise SystemExit(f"execgate: --grace {args.grace}: must be a number of seconds >= 0")
    try:
        import anyio

        from execgate.client.mcpbridge import BridgeConfig, serve_http, serve_stdio
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in MCP_EXTRA:
            raise
        print(
            f"execgate: `execgate mcp` needs the mcp extra (missing: {exc.name}); "
            "install it with: pip install 'execgate[mcp]'",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(message)s",
    )
    config = BridgeConfig(
        address=args.addr,
        token=args.token,
        tls=cli_options.tls(args),
        run_id=args.run_id,
        workspace=args.workspace,
        cancel_grace=args.grace,
        heartbeat=args.heartbeat,
    )
    if args.http is None:
        anyio.run(serve_stdio, config)
        return 0
    host, port = _host_port(args.http)
    anyio.run(serve_http, config, host, port, _ready)
    return 0


def _ready(url: str) -> None:
    print(f"execgate mcp: serving MCP at {url}", file=sys.stderr, flush=True)


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise SystemExit(f"execgate: --http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8765")
    return host, int(port)
