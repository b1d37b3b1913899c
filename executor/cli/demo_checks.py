"""What `execgate demo` checks before it narrates, and what it says after.

Against a daemon that `--addr` names, the demo first asks it (Explain: nothing runs)
how its policy would decide each call of the script; if any call would not get the
decision the demo's own policy gives it, the demo says which and stops, rather than
narrating steps that would not happen.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from execgate.client import Call, Client, ExecgateClientError
from execgate.client.models import Turn

# The decision the demo's policy gives each call, by its first argv word (or tool).
EXPECTED = {"read_file": "allow", "sh": "allow", "touch": "ask"}


@dataclass(frozen=True, slots=True)
class Gap:
    call: str
    expected: str
    got: str


def missing_rules(client: Client, steps: Sequence[Turn]) -> list[Gap]:
    """The script's calls the daemon's policy would decide otherwise than the demo's."""
    calls = [c for turn in steps for c in turn.tool_calls]
    probes = [
        Call(tool=c.name, arguments=c.arguments, call_id=f"probe{i}") for i, c in enumerate(calls)
    ]
    try:
        plans = client.explain(probes)
    except ExecgateClientError as exc:
        return [Gap("explain", "an answer", str(exc))]
    gaps = []
    for call, plan in zip(calls, plans, strict=True):
        argv = call.arguments.get("argv") if isinstance(call.arguments, dict) else None
        key = str(argv[0]) if isinstance(argv, list) and argv else call.name
        expected = EXPECTED.get(key, "allow")
        if plan.rejected is not None:
            got = f"rejected ({plan.rejected.error_class}: {plan.rejected.message})"
        elif plan.policy is None:
            got = "no decision"
        else:
            got = f"{plan.policy.effect} ({', '.join(plan.policy.rule_ids) or 'default'})"
        if plan.rejected is not None or plan.policy is None or plan.policy.effect != expected:
            gaps.append(Gap(_describe(call.name, argv), expected, got))
    return gaps


def _describe(tool: str, argv: object) -> str:
    if isinstance(argv, list):
        return f"{tool} {shlex.join(str(a) for a in argv)}"
    return tool


def explain_gaps(address: str, gaps: list[Gap]) -> str:
    lines = [f"execgate demo: the policy of the daemon at {address} lacks the demo's rules:"]
    lines += [f"  {g.call}: would be {g.got}; the demo needs {g.expected}" for g in gaps]
    lines.append(
        "start that daemon with the demo's policy (`execgate demo --print-policy > demo.yaml`, "
        "then `execgate serve --policy demo.yaml`), or run `execgate demo` without --addr"
    )
    return "\n".join(lines)


def how_to_trace(root: Path, run_id: str) -> str:
    sock = root / "state" / "execgate.sock"
    serve = (
        f"execgate serve --state-dir {root / 'state'} --workspace {root / 'workspace'} "
        f"--policy {root / 'policy.yaml'} --identities {root / 'identities.yaml'}"
    )
    trace = f'execgate trace {run_id} --addr unix:{sock} --token="$(cat {root / "operator.token"})"'
    return f"journal kept in {root / 'state'}; to trace the run:\n  {serve} &\n  {trace}"
