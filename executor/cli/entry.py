"""The `execgate` console script's entry: the CLI, or what to install for it.

`pip install execgate` is the thin client library (grpcio, protobuf, the
OpenTelemetry API). The daemon and the command line need the `daemon` extra;
on a thin install this says so instead of failing with a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# The packages only the daemon extra brings; a missing one means a thin install.
DAEMON_ONLY = frozenset(
    {"yaml", "jsonschema", "regex", "rich", "psutil", "docker", "filelock", "sqlglot", "wcmatch"}
    | {"grpc_health", "grpc_reflection", "opentelemetry"}
)


def main(argv: Sequence[str] | None = None) -> int:
    # The CLI imports a command's module only when that command runs (`--help` needs
    # none of them), so a thin install fails, if at all, when the command is parsed or run.
    try:
        from .main import main as cli_main

        return cli_main(argv, own_process=argv is None)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in DAEMON_ONLY:
            raise
        print(
            f"execgate: this command needs the daemon extra (missing: {exc.name}); "
            "install it with: pip install 'execgate[daemon]'",
            file=sys.stderr,
        )
        return 2
