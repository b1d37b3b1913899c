"""`execgate calls show CALL` for a person: the call, the policy decision that let it run
(or not), the evidence of what it did, and its timeline with times since it was queued.

Also the one-line outcome that `execgate call` prints: every outcome names its run.
"""

from __future__ import annotations

import datetime
import sys

from rich.console import Console
from rich.markup import escape

from execgate.client import CallRecord, Evidence, Outcome, Status

STATUS_STYLE = {
    Status.SUCCESS: "green",
    Status.PARTIAL: "yellow",
    Status.FAILURE: "red",
    Status.REJECTED: "magenta",
    Status.UNKNOWN_OUTCOME: "bold red",
}


def print_outcome(console: Console, o: Outcome, run_id: str) -> None:
    """`STATUS class (field f)  run R  call C — message`, then the result text."""
    style = STATUS_STYLE[o.status]
    head = f"[{style}]{o.status.value.upper()}[/{style}]"
    if o.error_class != "none":
        head += f" {o.error_class}"
    if o.field:
        head += f" (field {escape(o.field)})"
    head += f"  run {escape(run_id)}  call {escape(o.call_id)}"
    if o.replay_of:
        head += f" (replay of {escape(o.replay_of)})"
    console.print(head + (f"  — {escape(o.message)}" if o.message else ""), overflow="fold")
    if o.text:
        console.file.flush()
        sys.stdout.write(o.text if o.text.endswith("\n") else o.text + "\n")
    if o.truncated:
        console.print(f"[yellow]… truncated: {o.returned_bytes} of {o.total_bytes} bytes[/yellow]")


def print_record(console: Console, record: CallRecord, *, raw: bool = False) -> None:
    def field(name: str, value: object) -> None:
        console.print(f"[bold]{name}[/bold]: {escape(str(value))}", overflow="fold")

    field("run", record.run_id)
    field("call", record.call_id)
    field("batch", record.batch_id or "-")
    field("tool", record.tool)
    field("arguments", record.arguments_json)
    field("agent", record.agent)
    field("workspace", record.workspace or "-")
    field("writes", "yes" if record.may_write else "no")
    if record.idempotency_key:
        field("idempotency key", record.idempotency_key)
    field("policy", policy_line(record))
    o = record.outcome
    if record.awaiting_approval:
        who = ", ".join(record.approvers) or "an approver"
        at = datetime.datetime.fromtimestamp(record.approval_expires_at or 0.0)
        expires = at.strftime("%Y-%m-%d %H:%M:%S")
        field(
            "state",
            f"waiting for approval {record.awaiting_approval} (decided by {who}; "
            f"expires {expires})",
        )
        return
    if o is None:
        field("state", "running")
        return
    console.print("[bold]outcome[/bold]:")
    print_outcome(console, o, record.run_id)
    field("evidence", evidence_line(o.evidence))
    field("stopped", o.stopped_how.value)
    console.print("[bold]timeline[/bold] (seconds since the first mark):")
    start = o.timeline[0].at if o.timeline else 0.0
    for m in o.timeline:
        detail = f"  {escape(m.detail)}" if m.detail else ""
        console.print(f"  +{m.at - start:8.3f}s  {m.phase}{detail}", overflow="fold")
    if raw:
        field("raw_result", record.raw_result)


def policy_line(record: CallRecord) -> str:
    """`allow by rule-a, rule-b (revision 1a2b3c4d5e6f)`, or why there is none."""
    d = record.policy
    if d is None:
        return "no decision (refused before the policy was asked)"
    rules = ", ".join(d.rule_ids) or "default"
    line = f"{d.effect} by {rules} (revision {d.revision[:12] or '?'})"
    if d.shadow:
        line += f"; shadow rules matched: {', '.join(d.shadow)}"
    return line


def evidence_line(e: Evidence) -> str:
    """Every fact the sandbox and tool recorded; `-` for none."""
    facts = []
    if e.exit_code is not None:
        facts.append(f"exit code {e.exit_code}")
    if e.signal is not None:
        facts.append(f"signal {e.signal}")
    if e.oom_killed:
        facts.append("OOM-killed")
    if e.survivors is not None:
        facts.append(f"survivors {e.survivors}")
    if e.sandbox:
        facts.append(f"sandbox {e.sandbox}")
    if e.path:
        facts.append(f"path {e.path}")
    if e.bytes_read is not None:
        facts.append(f"read {e.bytes_read} B")
    if e.bytes_written is not None:
        facts.append(f"wrote {e.bytes_written} B")
    if e.sha256_before:
        facts.append(f"sha256 before {e.sha256_before}")
    if e.sha256_after:
        facts.append(f"sha256 after {e.sha256_after}")
    return ", ".join(facts) or "-"
