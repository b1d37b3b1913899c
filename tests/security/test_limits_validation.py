"""Every numeric setting has a finite range, checked where it enters (issue 13).

Daemon flags through the real `execgate serve` (a bad value exits non-zero at once,
naming the flag, no traceback), the policy's `limits:` and sandbox limits through
`execgate policy check` (file:line:column naming the field), a hypothesis corpus of
arbitrary values per policy field (accepted only if in range), the bounds
themselves accepted, and a bad hot reload refused with the last good policy kept.
"""

from __future__ import annotations

import math
import re
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from execgate.client import Call, Client, Status
from execgate.executor.cli.main import main
from execgate.executor.core import ranges
from execgate.executor.core.errors import PolicyError
from execgate.executor.policy import default_policy_path
from execgate.executor.policy.load import load_text
from execgate.executor.sandbox.base import Confinement, fit_confinement
from tests.daemon import Daemon
from tests.security.budget import fuzzing
from tests.support import wait_until

# ---------------------------------------------------------------- daemon flags

SERVE_FLAGS = ("--grace", "--default-timeout", "--output-cap", "--file-cap")
BAD_FLAG_VALUES = ("nan", "inf", "-inf", "-1", "0", "1e308", str(1 << 40), "abc", "")
SERVE_CASES = [(f, v) for f in SERVE_FLAGS for v in BAD_FLAG_VALUES]
# Refused at startup means before listening: well within this (the import dominates).
QUICK = 15.0


def serve(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "execgate.executor.cli", "serve"]
    cmd += ["--workspace", str(root / "ws"), "--state-dir", str(root / "st"), *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=QUICK, cwd=root)
    except subprocess.TimeoutExpired as exc:  # it started serving: the value was accepted
        raise AssertionError(f"serve {' '.join(args)} accepted the value and kept running") from exc


@pytest.mark.parametrize(("flag", "value"), SERVE_CASES)
def test_a_bad_flag_stops_serve_at_once_naming_it(tmp_path: Path, flag: str, value: str) -> None:
    done = serve(tmp_path, f"{flag}={value}")
    assert done.returncode != 0
    assert flag in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "st").exists() or not list((tmp_path / "st").glob("*.sock"))


@pytest.mark.parametrize(
    "args",
    [
        ("--grace", "0.001", "--default-timeout", "0.001", "--output-cap", "1024",
         "--file-cap", "1024"),
        ("--grace", "600", "--default-timeout", "86400", "--output-cap", str(64 << 20),
         "--file-cap", str(1 << 30)),
    ],
    ids=["lowest", "highest"],
)  # fmt: skip
def test_flags_at_their_bounds_are_accepted(tmp_path: Path, args: tuple[str, ...]) -> None:
    d = Daemon(tmp_path, *args).start()
    assert d.stop() == 0


# ---------------------------------------------------------------- policy fields

CALL_LIMITS = {  # limits: field -> (lowest, highest) accepted
    "timeout_s": (0.001, 86400),
    "grace_s": (0.001, 600),
    "output_cap_kb": (1, 64 * 1024),
    "file_cap_kb": (1, 1024 * 1024),
}
SANDBOX_FIELDS = {  # sandbox limits: field -> (Confinement field, unit)
    "cpu_seconds": ("cpu_seconds", 1),
    "memory_mb": ("memory_bytes", 1 << 20),
    "file_size_mb": ("file_size_bytes", 1 << 20),
    "open_files": ("open_files", 1),
    "processes": ("processes", 1),
}


def sandbox_bounds(name: str) -> tuple[int, int]:
    r = ranges.confinement_range(*SANDBOX_FIELDS[name])
    return int(r.low), int(r.high)


COMMON_BAD: tuple[Any, ...] = (0, -1, math.nan, math.inf, -math.inf, 1e308, True, "soon", [1])
BAD_CALL_LIMITS = {
    "timeout_s": (86401, 1 << 40),
    "grace_s": (600.5, 1e9),
    "output_cap_kb": (0.5, 64 * 1024 + 1, 1 << 40),
    "file_cap_kb": (0.5, 1024 * 1024 + 1, 1 << 40),
}
BAD_SANDBOX = (1.5, 1 << 40, 1 << 63, 1 << 80)
POLICY_CASES = [
    ("limits", f, v) for f, extra in BAD_CALL_LIMITS.items() for v in COMMON_BAD + extra
]
POLICY_CASES += [("sandbox", f, v) for f in SANDBOX_FIELDS for v in COMMON_BAD + BAD_SANDBOX]
POLICY_CASES += [("sandbox", f, sandbox_bounds(f)[1] + 1) for f in SANDBOX_FIELDS]
POLICY_CASES += [("sandbox", f, sandbox_bounds(f)[0] - 1) for f in SANDBOX_FIELDS]


def policy_with(section: str, field: str, value: Any) -> str:
    doc = yaml.safe_load(default_policy_path().read_text())
    if section == "limits":
        doc["limits"] = [{"tools": ["run_command"], field: value}]
    else:
        doc["sandbox"][0]["limits"] = {field: value}
    return yaml.safe_dump(doc)


def check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`execgate policy check` (it reports on stdout: `FAIL file:line:col: ...`)."""
    code = main(["policy", "check", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize(("section", "field", "value"), POLICY_CASES, ids=repr)
def test_policy_check_refuses_an_out_of_range_value_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, field: str, value: Any
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(policy_with(section, field, value))
    code, out = check(path, capsys)
    assert code != 0
    where = "limits[0]" if section == "limits" else "sandbox[0].limits"
    assert f"{where}.{field}: must be" in out
    assert f"FAIL {path}:" in out


@pytest.mark.parametrize("field", [*CALL_LIMITS, *SANDBOX_FIELDS])
@pytest.mark.parametrize("end", [0, 1], ids=["lowest", "highest"])
def test_policy_values_at_their_bounds_are_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, end: int
) -> None:
    section = "limits" if field in CALL_LIMITS else "sandbox"
    value = CALL_LIMITS[field][end] if field in CALL_LIMITS else sandbox_bounds(field)[end]
    path = tmp_path / "p.yaml"
    path.write_text(policy_with(section, field, value))
    code, out = check(path, capsys)
    assert code == 0, out
    assert out.startswith("ok ")


values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.booleans(),
    st.text(max_size=8),
    st.none(),
)


def in_range(field: str, value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    if field in CALL_LIMITS:
        low, high = CALL_LIMITS[field]
        return (value > 0 if low < 1 else value >= low) and value <= high
    low, high = sandbox_bounds(field)
    return isinstance(value, int) and low <= value <= high


@fuzzing(300)
@given(field=st.sampled_from([*CALL_LIMITS, *SANDBOX_FIELDS]), value=values)
def test_any_value_is_either_in_range_or_refused_naming_the_field(field: str, value: Any) -> None:
    section = "limits" if field in CALL_LIMITS else "sandbox"
    text = policy_with(section, field, value)
    if in_range(field, value):
        load_text(text, "p.yaml")
    else:
        with pytest.raises(PolicyError, match=re.escape(f".{field}: must be")):
            load_text(text, "p.yaml")


# ---------------------------------------------------------------- hot reload


def test_a_reload_with_an_out_of_range_limit_keeps_the_last_good_policy(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_with("limits", "timeout_s", 30))
    root = tmp_path / "d"
    root.mkdir()
    d = Daemon(root, "--policy", str(policy)).start()
    try:
        (d.workspace / "a.txt").write_text("hello")
        tmp = policy.with_suffix(".tmp")
        tmp.write_text(policy_with("limits", "timeout_s", 1e308))
        tmp.rename(policy)
        journal = f"file:{d.state_dir / 'journal.db'}?mode=ro"

        def refusals() -> list[str]:
            with sqlite3.connect(journal, uri=True) as conn:
                rows = conn.execute("SELECT accepted, message FROM policy_events").fetchall()
            return [m for ok, m in rows if not ok]

        wait_until(refusals, "the refusal to be journaled", timeout=10)
        assert "limits[0].timeout_s: must be" in refusals()[-1]
        with Client(d.address) as c:
            o = c.run(Call(tool="read_file", arguments={"path": "a.txt"}))
        assert o.status is Status.SUCCESS
    finally:
        d.stop()


def test_the_ceilings_follow_this_hosts_hard_rlimits() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY:
        assert sandbox_bounds("open_files")[1] == hard
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    if hard != resource.RLIM_INFINITY:
        assert sandbox_bounds("processes")[1] == hard


def test_built_in_limits_above_a_ceiling_are_lowered_to_it_not_refused() -> None:
    conf = Confinement(open_files=ranges.ceiling("open_files") + 1, processes=1 << 40)
    fitted, notes = fit_confinement(conf)
    assert fitted.open_files == ranges.ceiling("open_files")
    assert fitted.processes == ranges.ceiling("processes")
    assert fitted.memory_bytes == conf.memory_bytes
    assert [n.split()[0] for n in notes] == ["open_files", "processes"]
