"""`execgate policy check | explain | test`: for the people who write policy files.

`check` and `test` read files and decide as the daemon would. `explain` asks the
running daemon about the policy it enforces (the ExplainPolicy RPC), or reads a file
given with --policy; it exits 1 when the call would be denied.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from execgate.executor.core.errors import PolicyError
from execgate.executor.policy import Policy, PolicyInput, default_policy_path, load_policy
from execgate.executor.policy.explain import canonical, explain
from execgate.executor.policy.model import memberships

TEST_CASE_KEYS = {"name", "input", "expect", "rules"}
INPUT_KEYS = {"tool", "agent", "groups", "roles", "paths", "tables", "hosts", "argv", "args"}


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("policy", help="check, explain and test policies")
    cmds = p.add_subparsers(dest="policy_command", metavar="COMMAND", required=True)

    c = cmds.add_parser("check", help="validate policy files; every error, at file:line:column")
    c.add_argument("files", nargs="+", type=Path)
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(handler=_check)

    e = cmds.add_parser(
        "explain",
        help="the decision for one call, and why each rule did (not) match; exit 1 if denied",
    )
    e.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="explain against this file (default: ask the daemon, against the policy it runs)",
    )
    e.add_argument("--tool", required=True, help="the tool the call names")
    e.add_argument(
        "--agent",
        default="",
        help="the calling identity (default: local with --policy; else yourself)",
    )
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
    e.add_argument("--table", action="append", default=[], help="a table the call touches")
    e.add_argument("--host", action="append", default=[], help="a host the call reaches")
    e.add_argument("--json", action="store_true", help="machine-readable output")
    e.add_argument(
        "--addr", help="daemon address (default: $EXECGATE_ADDR or unix:var/execgate.sock)"
    )
    e.add_argument(
        "--token",
        default=None,
        help="bearer token (default: $EXECGATE_TOKEN, else make run's operator token)",
    )
    e.add_argument("--tls-ca", type=Path, metavar="PEM", help="CA of the daemon's cert")
    e.add_argument("--tls-cert", type=Path, metavar="PEM", help="your client certificate")
    e.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")
    e.set_defaults(handler=_explain)

    t = cmds.add_parser(
        "test", help="run policy test files (*.yaml under DIR): cases with expected decisions"
    )
    t.add_argument("dir", type=Path)
    t.add_argument("--json", action="store_true", help="machine-readable output")
    t.set_defaults(handler=_test)


def _check(args: argparse.Namespace) -> int:
    bad = 0
    report = []
    for path in args.files:
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            errors = getattr(exc, "errors", (exc,))
            report.append({"file": str(path), "ok": False, "errors": [str(e) for e in errors]})
            if not args.json:
                for err in errors:
                    print(f"FAIL {err}")
                if len(errors) > 1:
                    print(f"     {path}: {len(errors)} errors")
            bad += 1
            continue
        report.append(
            {
                "file": str(path),
                "ok": True,
                "errors": [],
                "rules": len(policy.rules),
                "revision": policy.revision,
            }
        )
        if not args.json:
            print(f"ok   {path}: {len(policy.rules)} rule(s), revision {policy.revision[:12]}")
    if args.json:
        print(json.dumps(report, indent=2))
    return 1 if bad else 0


def _explain(args: argparse.Namespace) -> int:
    """The decision for one described call; exit 1 when it is denied."""
    values = dict(_pair(a) for a in args.arg)
    if args.policy is not None:
        argv = values.get("argv")
        call = PolicyInput(
            tool=args.tool,
            agent=args.agent or "local",
            memberships=memberships(args.group, args.role),
            paths=tuple(canonical(p) for p in args.path),
            tables=tuple(args.table),
            hosts=tuple(args.host),
            argv=tuple(str(a) for a in argv) if isinstance(argv, list) else None,
            args=values,
        )
        found = explain(load_policy(args.policy), call)
    else:
        from .explain_remote import explain_remote  # grpc: only when asked

        found = explain_remote(args, values)
    if args.json:
        print(json.dumps(found.to_json(), indent=2))
    else:
        print("\n".join(found.lines()))
    return 1 if found.denied else 0


def _pair(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise PolicyError(f"--arg {text!r}: expected K=V")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def _test(args: argparse.Namespace) -> int:
    files = sorted(args.dir.rglob("*.yaml")) if args.dir.is_dir() else [args.dir]
    failed = passed = 0
    cases: list[dict[str, Any]] = []
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
            cases.append({"file": str(file), "index": i, "ok": ok, "message": message})
            if not args.json:
                print(("ok   " if ok else "FAIL ") + message)
    if args.json:
        print(json.dumps({"passed": passed, "failed": failed, "cases": cases}, indent=2))
    else:
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
        paths=tuple(canonical(p) for p in raw.get("paths", [])),
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
