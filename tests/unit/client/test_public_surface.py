"""The client library loads without the daemon (its public names are frozen in
tests/unit/test_public_surface.py, with every other package's)."""

from __future__ import annotations


def test_client_does_not_import_the_daemon() -> None:
    import subprocess
    import sys

    code = (
        "import sys, execgate.client; "
        "print(sorted(m for m in sys.modules if m.startswith('execgate.executor')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == "[]"
