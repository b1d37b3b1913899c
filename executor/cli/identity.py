"""Identity commands and flags: `execgate token new`, and `serve --identities/--tls-*`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from execgate.executor.core.errors import ConfigError
from execgate.executor.policy import local_identities
from execgate.executor.policy.identity import NAME_PATTERN, Role, hash_token, new_token
from execgate.executor.server.config import TlsFiles


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--identities",
        type=Path,
        default=None,
        metavar="FILE",
        help="identities file (YAML): who may call, with which roles; required for TCP. "
        "Without it only the Unix socket listens and its callers are `local`",
    )
    p.add_argument(
        "--local-identities",
        action="store_true",
        help="serve with an `agent` and an `operator` identity made once under the state "
        "directory (identities.yaml, tokens/*.token, owner-only); what `make run` does",
    )
    p.add_argument("--tls-cert", type=Path, default=None, metavar="PEM", help="server cert")
    p.add_argument("--tls-key", type=Path, default=None, metavar="PEM", help="its private key")
    p.add_argument(
        "--tls-client-ca",
        type=Path,
        default=None,
        metavar="PEM",
        help="CA of the client certificates; with --tls-cert/--tls-key, TCP listeners "
        "are mTLS (client certificates required)",
    )


def identities_file(args: argparse.Namespace) -> Path | None:
    """--identities, or the local identities (made if need be) for --local-identities."""
    if not args.local_identities:
        return Path(args.identities) if args.identities is not None else None
    if args.identities is not None:
        raise ConfigError("--identities and --local-identities: give one of them")
    return local_identities.ensure(args.state_dir).file


def tls_files(args: argparse.Namespace) -> TlsFiles | None:
    given = (args.tls_cert, args.tls_key, args.tls_client_ca)
    if not any(given):
        return None
    if not all(given):
        raise ConfigError("--tls-cert, --tls-key and --tls-client-ca go together")
    return TlsFiles(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = sub.add_parser("token", help="bearer tokens for the identities file")
    commands = token.add_subparsers(dest="token_cmd", required=True)
    p = commands.add_parser(
        "new", help="print a fresh token and the identities-file entry holding its sha256"
    )
    p.add_argument("name", help="the identity's name (what the journal records)")
    p.add_argument(
        "--role",
        action="append",
        choices=list(Role),
        default=None,
        help="a role of the identity; repeatable (default: agent)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_token_new)


def _token_new(args: argparse.Namespace) -> int:
    if not NAME_PATTERN.fullmatch(args.name):
        raise ConfigError(
            f"{args.name!r} is not a name (letters, digits, '.', '_', '@', '-'; at most 64)"
        )
    token = new_token()
    roles = ", ".join(dict.fromkeys(args.role or [Role.AGENT]))
    if args.json:
        entry = {"name": args.name, "roles": roles.split(", "), "token_sha256": hash_token(token)}
        print(json.dumps({"token": token, "entry": entry}, indent=2))
        return 0
    print(f"EXECGATE_TOKEN={token}")
    print(f"# Give the line above to {args.name}; it is stored nowhere and not shown again.")
    print("# Paste this under `identities:` in the identities file:")
    print(f"  - name: {args.name}")
    print(f"    roles: [{roles}]")
    print(f"    token_sha256: {hash_token(token)}")
    return 0
