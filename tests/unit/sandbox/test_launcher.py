"""spawn.launcher: the shell script that confines a call (rlimits, cgroup entry)."""

from __future__ import annotations

from pathlib import Path

import pytest

from execgate.executor.sandbox import Confinement


def test_memory_is_the_cgroups_limit_where_there_is_one(tmp_path: Path) -> None:
    from execgate.executor.sandbox.cgroup import CallCgroup
    from execgate.executor.sandbox.spawn import DASH, launcher

    if DASH is None:
        pytest.skip("the dash launcher is used only where dash is installed")
    conf = Confinement(memory_bytes=64 << 20)
    group = CallCgroup((tmp_path,))
    script = launcher(conf, group)[2]
    assert f"ulimit -v {64 << 10}" in script  # no memory cgroup: the address-space rlimit
    assert f"echo 0 > {tmp_path}/cgroup.procs" in script
    group.limits_memory = True
    assert "ulimit -v" not in launcher(conf, group)[2]  # resident memory, by the cgroup
    assert "ulimit -p 256" in launcher(conf, None)[2]
