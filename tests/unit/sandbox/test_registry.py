"""Sandboxes.for_call: the first matching `sandbox:` rule of the policy picks a call's
backend and confinement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from execgate.executor.policy import load_policy
from execgate.executor.sandbox import Confinement, SandboxError
from execgate.executor.sandbox.registry import Sandboxes


def policy_file(tmp_path: Path, sandbox: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\ndefault: deny\nrules:\n"
        "  - {id: all, effect: allow, tools: ['*']}\n"
        f"sandbox:\n{sandbox}"
    )
    return path


class Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_first_matching_sandbox_rule_decides(tmp_path: Path) -> None:
    policy = load_policy(
        policy_file(
            tmp_path,
            "  - {tools: [run_command], backend: process, network: true,"
            " limits: {memory_mb: 64, processes: 16}}\n"
            "  - {tools: ['run_*'], backend: docker}\n",
        )
    )
    backends: dict[str, Any] = {n: Named(n) for n in ("bwrap", "process", "docker")}
    base = Confinement()
    boxes = Sandboxes(backends, "bwrap", policy.sandbox_for, base)
    box, conf = boxes.for_call("run_command")
    assert box.name == "process"
    assert conf.network is True
    assert conf.memory_bytes == 64 << 20
    assert conf.processes == 16
    assert conf.cpu_seconds == base.cpu_seconds
    assert boxes.for_call("run_other")[0].name == "docker"
    box, conf = boxes.for_call("work")  # no rule: the default, no network
    assert box.name == "bwrap"
    assert conf == base
    assert conf.network is False


def test_a_declaration_places_a_tool_where_no_rule_says_otherwise(tmp_path: Path) -> None:
    policy = load_policy(
        policy_file(
            tmp_path,
            "  - {tools: [ruled], backend: bwrap, network: true, limits: {processes: 8}}\n"
            "  - {tools: [lowered], limits: {processes: 4, open_files: 4096}}\n",
        )
    )
    backends: dict[str, Any] = {n: Named(n) for n in ("bwrap", "process", "docker")}
    base = Confinement()
    boxes = Sandboxes(backends, "bwrap", policy.sandbox_for, base)
    placed = ("docker", (("processes", 16), ("memory_bytes", 64 << 20)))
    box, conf = boxes.for_call("free", placed=placed)
    assert box.name == "docker"
    assert (conf.processes, conf.memory_bytes, conf.network) == (16, 64 << 20, False)
    box, conf = boxes.for_call("ruled", placed=placed)  # the rule's backend and network win
    assert box.name == "bwrap"
    assert (conf.processes, conf.network) == (8, True)
    box, conf = boxes.for_call("lowered", placed=placed)  # a rule lowers, never raises
    assert box.name == "docker"
    assert (conf.processes, conf.open_files) == (4, 4096)
    assert boxes.for_call("lowered", placed=("docker", (("processes", 2),)))[1].processes == 2


def test_a_declaration_cannot_loosen_the_backend_to_process(tmp_path: Path) -> None:
    """A tools file's `process` would drop the read-only workspace, the network namespace
    and the per-call isolation the daemon's bwrap gives; only the policy may choose it."""
    policy = load_policy(policy_file(tmp_path, "  - {tools: [chosen], backend: process}\n"))
    backends: dict[str, Any] = {n: Named(n) for n in ("bwrap", "process")}
    boxes = Sandboxes(backends, "bwrap", policy.sandbox_for, Confinement())
    with pytest.raises(SandboxError, match="weaker than bwrap"):
        boxes.for_call("free", placed=("process", ()))
    assert boxes.for_call("chosen", placed=("process", ()))[0].name == "process"
    assert boxes.for_call("free", placed=("bwrap", ()))[0].name == "bwrap"
    on_process = Sandboxes(backends, "process", policy.sandbox_for, Confinement())
    assert on_process.for_call("free", placed=("process", ()))[0].name == "process"
