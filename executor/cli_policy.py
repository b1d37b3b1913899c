"""`execgate policy check | explain | test`: for the people who write policy files.

None of these needs a daemon: they read the files and decide as the daemon would.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import yaml

from .errors import PolicyError
from .policy import Policy, PolicyInput, default_policy_path, load_policy
from .policy.model import memberships

TEST_CASE_KEYS = {"name", "input", "expect", "rules"}
INPUT_KEYS = {"tool", "agent", "groups", "roles", "paths", "tables", "hosts", "argv", "args"}


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("policy", help="check, explain and test policy files (no daemon needed)")
    cmds = p.add_subparsers(dest="policy_command", metavar="COMMAND", required=True)

    c = cmds.add_parser("check", help="validate policy files; every error, at file:line:column")
    c.add_argument("files", nargs="+", type=Path)
    c.set_defaults(handler=_check)

    e = cmds.add_parser(
        "explain", help="the decision for one call, and why each rule did (not) match"
    )
    e.add_argument("--policy", type=Path, default=None, help="default: the shipped policy")
    e.add_argument("--tool", required=True)
    e.add_argument("--agent", default="local")
    e.add_argument("--group", action="append", default=[], help="a group the agent is in")
    e.add_argument("--role", action="append", default=[], help="a role the agent holds")
    e.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="K=V",
        help="argument (V as JSON if it parses)",
    )
    e.add_argument(
        "--path", action="append", default=[], help="a workspace-relative path the call touches"
    )
    e.add_argument("--table", action="append", default=[])
    e.add_argument("--host", action="append", default=[])
    e.add_argument("--json", action="store_true")
    e.set_defaults(handler=_explain)

    t = cmds.add_parser(
        "test", help="run policy test files (*.yaml under DIR): cases with expected decisions"
    )
    t.add_argument("dir", type=Path)
    t.set_defaults(handler=_test)


def _check(args: argparse.Namespace) -> int:
    bad = 0
    for path in args.files:
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            errors = getattr(exc, "errors", (exc,))
            for err in errors:
                print(f"FAIL {err}")
            if len(errors) > 1:
                print(f"     {path}: {len(errors)} errors")
            bad += 1
            continue
        print(f"ok   {path}: {len(policy.rules)} rule(s), revision {policy.revision[:12]}")
    return 1 if bad else 0


def _explain(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy or default_policy_path())
    values = dict(_pair(a) for a in args.arg)
    argv = values.get("argv")
    call = PolicyInput(
        tool=args.tool,
        agent=args.agent,
        memberships=memberships(args.group, args.role),
        paths=tuple(_canonical(p) for p in args.path),
        tables=tuple(args.table),
        hosts=tuple(args.host),
        argv=tuple(str(a) for a in argv) if isinstance(argv, list) else None,
        args=values,
    )
    decision = policy.decide(call)
    rows = [(r.id, r.effect.value, r.shadow, r.mismatches(call)) for r in policy.rules]
    runs = _how_it_runs(policy, call)
    if args.json:
        print(
            json.dumps(
                {
                    "effect": decision.effect.value,
                    "rules": list(decision.rule_ids),
                    "reason": decision.reason,
                    "revision": decision.revision,
                    "shadow": [[rid, eff.value] for rid, eff in decision.shadow],
                    "each_rule": [
                        {"id": i, "effect": e, "shadow": s, "not_matched_by": list(m)}
                        for i, e, s, m in rows
                    ],
                    "runs_with": runs,
                },
                indent=2,
            )
        )
        return 0
    by = ", ".join(decision.rule_ids) or "default"
    print(f"decision: {decision.effect.value} ({by}): {decision.reason}")
    for rid, effect, shadow, failed in rows:
        mode = " [shadow]" if shadow else ""
        verdict = "matches" if not failed else "does not match: " + ", ".join(failed)
        print(f"  {rid} ({effect}{mode}) {verdict}")
    if decision.ask is not None:
        who = ", ".join(decision.ask.approvers)
        print(f"approval: needed from {who}, expires after {decision.ask.ttl:g}s")
    print("runs with: " + ", ".join(f"{k} {v}" for k, v in runs.items()))
    print(f"policy {policy.source} revision {decision.revision[:12]}")
    return 0


def _how_it_runs(policy: Policy, call: PolicyInput) -> dict[str, Any]:
    """The sandbox and limits the policy sets for the call ("daemon default": unset)."""
    rule = policy.sandbox_for(call.tool, call.agent, call.memberships)
    limits = policy.limits_for(call)
    unset = "daemon default"
    return {
        "sandbox": rule.backend if rule is not None else "default",
        "network": rule.network if rule is not None else False,
        "timeout_s": limits.timeout if limits.timeout is not None else unset,
        "grace_s": limits.grace if limits.grace is not None else unset,
        "output_cap_bytes": limits.output_cap if limits.output_cap is not None else unset,
    }


def _pair(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise PolicyError(f"--arg {text!r}: expected K=V")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def _canonical(path: str) -> str:
    """Workspace-relative, normalised as the daemon does (`..` and `.` folded)."""
    norm = os.path.normpath(path).lstrip("/")
    return norm or "."


def _test(args: argparse.Namespace) -> int:
    files = sorted(args.dir.rglob("*.yaml")) if args.dir.is_dir() else [args.dir]
    failed = passed = 0
    for file in files:
        doc = yaml.safe_load(file.read_text())
        if not isinstance(doc, dict) or "cases" not in doc:
            continue  # not a test file (a policy next to its tests, say)
        policy = (
            load_policy((file.parent / str(doc.get("policy", ""))).resolve())
            if doc.get("policy")
            else load_policy(default_policy_path())
        )
        for i, case in enumerate(doc["cases"]):
            ok, message = _run_case(policy, case, f"{file}: cases[{i}]")
            passed += ok
            failed += not ok
            print(("ok   " if ok else "FAIL ") + message)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


def _run_case(policy: Policy, case: Any, where: str) -> tuple[bool, str]:
    if (
        not isinstance(case, dict)
        or set(case) - TEST_CASE_KEYS
        or "input" not in case
        or "expect" not in case
    ):
        return False, f"{where}: a case is {{name, input, expect, rules?}}"
    raw = case["input"]
    if not isinstance(raw, dict) or set(raw) - INPUT_KEYS or "tool" not in raw:
        return False, f"{where}.input: keys {sorted(INPUT_KEYS)}, tool required"
    for key in ("groups", "roles"):
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return False, f"{where}.input.{key}: must be a list of names"
    argv = raw.get("argv")
    call = PolicyInput(
        tool=raw["tool"],
        agent=raw.get("agent", "local"),
        memberships=memberships(raw.get("groups", []), raw.get("roles", [])),
        paths=tuple(_canonical(p) for p in raw.get("paths", [])),
        tables=tuple(raw.get("tables", [])),
        hosts=tuple(raw.get("hosts", [])),
        argv=tuple(argv) if isinstance(argv, list) else None,
        args=raw.get("args", {}),
    )
    decision = policy.decide(call)
    name = case.get("name", where)
    got = decision.effect.value
    if got != case["expect"]:
        by = ", ".join(decision.rule_ids) or "default"
        return False, f"{name}: expected {case['expect']}, got {got} ({by})"
    if "rules" in case and sorted(case["rules"]) != sorted(decision.rule_ids):
        return False, f"{name}: expected rules {case['rules']}, got {list(decision.rule_ids)}"
    return True, f"{name}: {got}"
