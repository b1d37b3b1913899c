"""The policy's `sandbox:` entries: each bad one refused, naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from execgate.executor.core.errors import PolicyError
from execgate.executor.policy import load_policy


def policy_file(tmp_path: Path, sandbox: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\ndefault: deny\nrules:\n"
        "  - {id: all, effect: allow, tools: ['*']}\n"
        f"sandbox:\n{sandbox}"
    )
    return path


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ("  - {tools: [x], backend: vm}\n", "sandbox[0].backend"),
        ("  - {tools: [x], network: 'yes'}\n", "sandbox[0].network"),
        ("  - {tools: [x], limits: {memory_mb: -1}}\n", "sandbox[0].limits.memory_mb"),
        ("  - {tools: [x], limits: {ram: 3}}\n", "unknown key 'ram'"),
        ("  - {backend: bwrap}\n", "sandbox[0].tools"),
        ("  - {tools: [x], color: red}\n", "unknown key 'color'"),
    ],
)
def test_bad_sandbox_entries_are_named(tmp_path: Path, entry: str, complaint: str) -> None:
    with pytest.raises(PolicyError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        load_policy(policy_file(tmp_path, entry))
