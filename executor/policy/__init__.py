"""Authorization: may this call run, must someone approve it, or is it denied?

The policy file's format and its checks are in `load`, the rules and precedence
in `model`. A `Policy` is immutable: a reload builds a new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import PolicyError, ToolError
from ..outcomes import ErrorClass, Status
from .load import SandboxRule, load_text, read_file
from .model import Decision, Effect, PolicyInput, Rule, decide, path_glob

__all__ = [
    "Decision",
    "Effect",
    "Policy",
    "PolicyError",
    "PolicyInput",
    "Rule",
    "SandboxRule",
    "default_policy_path",
    "load_policy",
    "parse_policy",
    "path_glob",
]


@dataclass(frozen=True, slots=True)
class Policy:
    default: Effect
    rules: tuple[Rule, ...]
    # sha256 of the file's bytes: which policy made a decision.
    revision: str
    source: str
    sandbox: tuple[SandboxRule, ...] = ()

    def decide(self, call: PolicyInput) -> Decision:
        return decide(self.rules, self.default, self.revision, call)

    def require(self, call: PolicyInput) -> Decision:
        """The decision unless it denies the call; else the REJECTED ToolError to answer with."""
        return self.enforce(self.decide(call))

    def enforce(self, decision: Decision) -> Decision:
        """`decision` if it allows or asks (`decision.ask`: the caller parks the call
        for an approver, see executor.approve); raise the REJECTED ToolError of a deny."""
        if decision.effect is not Effect.DENY:
            return decision
        rules = ", ".join(decision.rule_ids) or "default"
        message = f"denied by policy ({rules}): {decision.reason}"
        raise ToolError(ErrorClass.POLICY_DENIED, message, field="tool", status=Status.REJECTED)

    def sandbox_for(self, tool: str) -> SandboxRule | None:
        """The first sandbox rule matching `tool` (None: daemon defaults, no network)."""
        return next((r for r in self.sandbox if r.matches(tool)), None)


def parse_policy(text: str, source: str) -> Policy:
    parsed = load_text(text, source)
    return Policy(parsed.default, parsed.rules, parsed.revision, source, parsed.sandbox)


def load_policy(path: str | Path) -> Policy:
    text, source = read_file(path)
    return parse_policy(text, source)


def default_policy_path() -> Path:
    return Path(str(resources.files("execgate.policies").joinpath("default.yaml")))
