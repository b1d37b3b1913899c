"""The daemon of another commit, run beside this one's in the same benchmark run.

`python bench/dispatch.py --base REV` measures the daemon at REV (`git archive REV`
into the run's temp dir) next to the work tree's, interleaved case by case, so a
before/after comparison sees the same machine load. The two trees must share
proto/: the generated `execgate.v1` of this install serves both.

The old tree is imported through a shim directory on PYTHONPATH: `execgate/` with
its `executor`, `client` and `policies` linked to the exported folders and `v1` to
this install's generated code. PYTHONPATH comes before the editable install's
finder, so the daemon started with it runs the old code (`export` checks that an
interpreter with that environment imports the daemon from the shim).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class BaselineError(Exception):
    """The baseline tree could not be prepared."""


def export(rev: str, into: Path) -> dict[str, str]:
    """Export the tree at `rev` under `into`; the environment a Daemon runs it with."""
    if _git("diff", "--quiet", rev, "--", "proto", check=False).returncode != 0:
        raise BaselineError(f"{rev} has another proto/ than the work tree: not comparable here")
    archive = _git("archive", "--format=tar", rev, "executor", "client", "policies").stdout
    src = into / "src"
    src.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src, filter="data")
    shim = into / "shim" / "execgate"
    shim.mkdir(parents=True)
    for name in ("executor", "client", "policies"):
        (shim / name).symlink_to(src / name)
    (shim / "v1").symlink_to(ROOT / "gen" / "execgate" / "v1")
    env = {"PYTHONPATH": str(into / "shim")}
    probe = subprocess.run(
        [sys.executable, "-c", "import execgate.executor as e; print(*e.__path__)"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    if probe.stdout.strip() != str(shim / "executor"):
        raise BaselineError(f"the shim is not what imports: {probe.stdout}{probe.stderr}")
    return env


def describe(rev: str) -> str:
    return _git("rev-parse", "--short", rev).stdout.decode().strip()


def _git(*args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=check)
    except subprocess.CalledProcessError as exc:
        raise BaselineError(f"git {' '.join(args)}: {exc.stderr.decode().strip()}") from exc
