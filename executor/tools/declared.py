"""A command tool declared in the tools file: one program, its argv a template.

The call is analysed once, at validation (`call_effects`): the argv, cwd and stdin
are expanded (each argv template is exactly one element; `{x...}` spreads an array),
the effects' paths resolved inside the workspace (an escape is REJECTED naming the
argument) and turned into claims. The tool runs exactly what was analysed
(`ToolContext.analysis`), through `run_sandboxed` and the cancel ladder, like
`run_command`. Secret values go to the child's environment only: they are cut out of
its output before anything leaves the tool (`[secret NAME]`). The checks around the run
(paths again under the call's locks, the secrets' cut) are in `declguard`.
"""

from __future__ import annotations

import json
import os
import secrets as tokens
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status, StopMode
from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Claim, Mode, path_key, workspace_key
from execgate.executor.sandbox import Launch

from . import confine, template
from .base import Declared, ToolContext, ToolOutput, ToolSpec
from .command import BASE_ENV, run_sandboxed
from .decl import CommandDecl, OutputMode, SandboxDecl
from .declguard import (
    field_of,
    masks,
    net_claim,
    not_an_option,
    path_text,
    redacted,
    table_claim,
    unchanged,
)
from .effects import CallEffects, file_key

__all__ = ["CommandTool", "Prepared"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one call runs: its argv, cwd and stdin, expanded and resolved."""

    argv: tuple[str, ...]
    cwd: Path
    stdin: bytes | None
    # (field, the expanded text, the path it resolved to) of the cwd and of every
    # effects path: re-resolved when the call starts (`_unchanged`), after its locks.
    checked: tuple[tuple[str, str, Path], ...] = ()


class CommandTool:
    """The `Tool` of one `CommandDecl` (provider "command")."""

    provider = "command"

    def __init__(self, decl: CommandDecl, environ: Mapping[str, str] | None = None) -> None:
        self.decl = decl
        # The daemon's environment: passthrough variables and secrets are read from it.
        self._environ = os.environ if environ is None else environ
        self.placement: SandboxDecl = decl.sandbox
        self.spec = ToolSpec(
            name=decl.name,
            description=decl.description,
            input_schema=decl.input_schema,
            read_only=not decl.effects.may_write,
            destructive=decl.destructive,
            idempotent=decl.idempotent,
        )

    def check(self, args: dict[str, Any]) -> None:
        """A secret the daemon's environment lacks: REJECTED before the call starts."""
        del args
        for child, source in self.decl.env.secrets:
            if source not in self._environ:
                raise ToolError(
                    ErrorClass.NOT_FOUND,
                    f"secret {child}: the daemon's environment has no {source}",
                    field=f"secrets.{child}",
                    status=Status.REJECTED,
                )

    # Its analysis expands templates and resolves paths: validation runs it on the
    # event loop, as run_command's.
    quick_analysis = True

    def call_effects(
        self, args: dict[str, Any], paths: Mapping[str, Path], workspace: Workspace
    ) -> CallEffects:
        del paths
        prepared = self._prepare(args, workspace)
        effects = self.decl.effects
        if not effects.declared:
            return CallEffects(
                (Claim(workspace_key(workspace.lock_root), Mode.WRITE),), True, prepared
            )
        found: dict[str, Path] = {}
        writes: list[Declared] = []
        claims = [
            *self._paths(effects.reads, "reads", Mode.READ, args, workspace, found),
            *self._writes(args, workspace, found, writes),
            *self._tables(effects.read_tables, "read_tables", Mode.READ, args, workspace),
            *self._tables(effects.write_tables, "write_tables", Mode.WRITE, args, workspace),
        ]
        claims += self._table_dirs(claims, workspace, writes)
        for i, host in enumerate(effects.net):
            value = template.parse(host).expand(args)
            claim = net_claim(value or "", field_of(host, f"effects.net[{i}]"))
            if claim is not None:
                claims.append(claim)
        checked = prepared.checked + tuple(
            (field, text, found[key]) for key, field, text in self._texts(args)
        )
        prepared = replace(prepared, checked=checked)
        return CallEffects(
            tuple(claims), effects.may_write, prepared, paths=found, confined=tuple(writes)
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        prepared = ctx.analysis
        if not isinstance(prepared, Prepared):  # run without validation (a unit test)
            prepared = self._prepare(args, ctx.workspace)
        unchanged(prepared.checked, ctx.workspace, ctx.hard_links)
        env, hidden = self._environment(ctx.workspace.root)
        async with confine.writable(ctx) as writes:
            launch = Launch(
                argv=prepared.argv,
                cwd=prepared.cwd,
                env=env,
                stdin=prepared.stdin,
                workspace=ctx.workspace.root,
                writable=ctx.may_write and writes is None,
                write_paths=writes or (),
                marker=ctx.marker or tokens.token_hex(8),
                confinement=ctx.confinement,
                output_cap=ctx.limits.raw_cap_bytes,
                run_id=ctx.run_id,
            )
            out = redacted(await run_sandboxed(launch, ctx), hidden)
        return confine.judged(self._judged(out), ctx.confined)

    # -- expansion ----------------------------------------------------------------

    def _prepare(self, args: dict[str, Any], workspace: Workspace) -> Prepared:
        argv = self._argv(args)
        cwd_text = template.parse(self.decl.cwd).expand(args) or "."
        cwd_field = field_of(self.decl.cwd, "cwd")
        cwd = workspace.resolve(cwd_text, cwd_field)
        stdin = None
        if self.decl.stdin is not None:
            text = template.parse(self.decl.stdin).expand(args)
            stdin = text.encode("utf-8", errors="surrogatepass") if text is not None else None
        return Prepared(tuple(argv), cwd, stdin, ((cwd_field, cwd_text, cwd),))

    def _argv(self, args: dict[str, Any]) -> list[str]:
        """Each template one element (a spread one per item); before a `--` element, no
        argument may make an element start with `-` (`declguard.not_an_option`)."""
        argv: list[str] = []
        guarded = True
        for item in self.decl.argv:
            guarded = guarded and item != "--"
            spread = template.spread_name(item)
            if spread is not None:
                values = template.spread(spread, args)
                for i, item_value in enumerate(values if guarded else ()):
                    field = f"arguments.{spread}[{i}]"
                    not_an_option(item_value, spread, field, self.decl.option_args)
                argv += values
                continue
            parsed = template.parse(item)
            value = parsed.expand(args)
            if value is None:
                continue
            if guarded:
                name = parsed.leader(args)
                not_an_option(value, name, f"arguments.{name}", self.decl.option_args)
            argv.append(value)
        return argv

    def _paths(
        self,
        templates: tuple[str, ...],
        key: str,
        mode: Mode,
        args: dict[str, Any],
        workspace: Workspace,
        found: dict[str, Path],
    ) -> list[Claim]:
        claims = []
        for i, text in enumerate(templates):
            value = path_text(text, args, f"effects.{key}[{i}]")
            if value is None:
                continue
            path = workspace.resolve(value, field_of(text, f"effects.{key}[{i}]"))
            found[f"effects.{key}[{i}]"] = path
            claims.append(Claim(file_key(workspace, path), mode))
        return claims

    def _writes(
        self,
        args: dict[str, Any],
        workspace: Workspace,
        found: dict[str, Path],
        writes: list[Declared],
    ) -> list[Claim]:
        """WRITE on each declared write path, which the sandbox makes writable (made
        first if it does not exist: confine.py)."""
        claims = []
        for i, text in enumerate(self.decl.effects.writes):
            where = f"effects.writes[{i}]"
            value = path_text(text, args, where)
            if value is None:
                continue
            declared = confine.declared_write(workspace, value, field_of(text, where))
            found[where] = declared.path
            writes.append(declared)
            claims.append(Claim(file_key(workspace, declared.path), Mode.WRITE))
        return claims

    @staticmethod
    def _table_dirs(
        claims: list[Claim], workspace: Workspace, writes: list[Declared]
    ) -> list[Claim]:
        """A table write needs its database's directory writable (SQLite makes its
        journal there): the sandbox binds that directory, so the call writes it."""
        out = []
        for claim in claims:
            parts = claim.key.parts
            if claim.mode is Mode.WRITE and parts[-1].startswith("\0"):
                rel = "/".join(parts[2:-2])  # ("ws", root, *folder, db, table)
                folder = workspace.root.joinpath(*parts[2:-2])
                if all(d.path != folder for d in writes):
                    writes.append(
                        Declared(f"effects.write_tables ({rel or '.'})", rel or ".", folder, True)
                    )
                    out.append(Claim(path_key(workspace.lock_root, rel), Mode.WRITE))
        return out

    def _tables(
        self,
        templates: tuple[str, ...],
        key: str,
        mode: Mode,
        args: dict[str, Any],
        workspace: Workspace,
    ) -> list[Claim]:
        claims = []
        for i, text in enumerate(templates):
            value = path_text(text, args, f"effects.{key}[{i}]")
            if value is not None:
                field = field_of(text, f"effects.{key}[{i}]")
                claims.append(table_claim(value, field, mode, workspace))
        return claims

    def _texts(self, args: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(`_paths`' key, the field it names, expanded text) of each effects path given."""
        out = []
        for key in ("reads", "writes"):
            for i, text in enumerate(getattr(self.decl.effects, key)):
                where = f"effects.{key}[{i}]"
                value = path_text(text, args, where)
                if value is not None:
                    out.append((where, field_of(text, where), value))
        return out

    # -- environment and result ---------------------------------------------------

    def _environment(self, home: Path) -> tuple[dict[str, str], dict[str, str]]:
        """The child's environment, and each secret's value -> its name (to redact)."""
        env = {**BASE_ENV, "HOME": str(home), **dict(self.decl.env.set)}
        for name in self.decl.env.passthrough:
            if name in self._environ:
                env[name] = self._environ[name]
        for child, source in self.decl.env.secrets:
            value = self._environ.get(source)
            if value is None:  # gone since validation
                raise ToolError(
                    ErrorClass.NOT_FOUND,
                    f"secret {child}: the daemon's environment has no {source}",
                    field=f"secrets.{child}",
                )
            env[child] = value
        return env, masks((child, env[child]) for child, _ in self.decl.env.secrets)

    def _judged(self, out: ToolOutput) -> ToolOutput:
        """Exit codes per `success_codes`; stdout parsed for `output: json`."""
        if out.stopped_how is not StopMode.COMPLETED or out.evidence.oom_killed:
            return out
        code = out.evidence.exit_code
        if code not in self.decl.success_codes:
            why = out.message or f"exited with status {code}"
            return replace(
                out, error_class=ErrorClass.NONZERO_EXIT, message=f"{why} (not a success code)"
            )
        # A success code is no failure; what else the message says stays (an escaped
        # process that held the output open: command._output).
        message = out.message
        if out.error_class is ErrorClass.NONZERO_EXIT:
            message = message.removeprefix(f"exited with status {code}").removeprefix("; ")
        out = replace(out, error_class=ErrorClass.NONE, message=message)
        if self.decl.output is OutputMode.JSON:
            return _json(out)
        return out


def _json(out: ToolOutput) -> ToolOutput:
    # `text` is stdout, then stderr after a "[stderr]" line (command._output).
    has_stdout = bool(out.structured.get("stdout_bytes"))
    stdout = out.text.split("\n[stderr]\n", 1)[0] if has_stdout else ""
    try:
        value = json.loads(stdout)
    except ValueError as exc:
        return replace(
            out,
            error_class=ErrorClass.IO_ERROR,
            message=f"output: json, but stdout is not JSON: {exc}",
        )
    structured = value if isinstance(value, dict) else {"value": value}
    return replace(out, structured=structured)
