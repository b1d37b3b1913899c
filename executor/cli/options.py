"""What every `execgate` command's parser shares, importing nothing heavy.

`execgate --help` must answer fast, so the parser modules' imports stay light: a command's
module (and grpc, rich, the client, the daemon) is imported only when that command runs.
The help formatter appends every option's default to its help text, so no option is
documented without it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from execgate.client import TlsConfig


class HelpFormatter(argparse.HelpFormatter):
    """Help text ends with `(default: …)` unless it already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            text == argparse.SUPPRESS
            or action.default == argparse.SUPPRESS  # -h, --version
            or "default" in text.lower()
            or not action.option_strings
        ):
            return text
        if action.required:
            return f"{text} (required)"
        return f"{text} (default: {_default(action)})"


def _default(action: argparse.Action) -> str:
    value: Any = action.default
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "on" if value else "off"
    if value is None or value == "" or value == []:
        return "none"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return "%(default)s"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults (subparsers inherit the class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def common() -> Parser:
    """The options of every command that talks to a daemon."""
    p = Parser(add_help=False)
    p.add_argument(
        "--addr", help="daemon address (default: $EXECGATE_ADDR or unix:var/execgate.sock)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--token", default=None, help="bearer token of your identity (default: $EXECGATE_TOKEN)"
    )
    p.add_argument("--tls-ca", type=Path, metavar="PEM", help="CA of the daemon's cert")
    p.add_argument("--tls-cert", type=Path, metavar="PEM", help="your client certificate")
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")
    return p


def json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def tls(args: argparse.Namespace) -> TlsConfig | None:
    """The mTLS files of --tls-ca, --tls-cert and --tls-key (all three, or none)."""
    given = (args.tls_ca, args.tls_cert, args.tls_key)
    if not any(given):
        return None
    if not all(given):
        raise SystemExit("execgate: --tls-ca, --tls-cert and --tls-key go together")
    from execgate.client import TlsConfig

    return TlsConfig(args.tls_ca, args.tls_cert, args.tls_key)
