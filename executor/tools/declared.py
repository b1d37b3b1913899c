"""A command tool declared in the tools file: one program, its argv a template.

The call is analysed once, at validation (`call_effects`): the argv, cwd and stdin
are expanded (each argv template is exactly one element; `{x...}` spreads an array),
the effects' paths resolved inside the workspace (an escape is REJECTED naming the
argument) and turned into claims. The tool runs exactly what was analysed
(`ToolContext.analysis`), through `run_sandboxed` and the cancel ladder, like
`run_command`. Secret values go to the child's environment only: they are cut out of
its output before anything leaves the tool (`[secret NAME]`).
"""

from __future__ import annotations

import json
import os
import secrets as tokens
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status, StopMode
from execgate.executor.core.paths import Workspace, hard_link_refused
from execgate.executor.locks import Claim, Mode, net_key, path_key, table_key, workspace_key
from execgate.executor.sandbox import Launch

from . import template
from .base import ToolContext, ToolOutput, ToolSpec
from .command import BASE_ENV, run_sandboxed
from .decl import CommandDecl, OutputMode, SandboxDecl
from .effects import CallEffects

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

    def call_effects(
        self, args: dict[str, Any], paths: Mapping[str, Path], workspace: Workspace
    ) -> CallEffects:
        del paths
        prepared = self._prepare(args, workspace)
        effects = self.decl.effects
        if not effects.declared:
            return CallEffects((Claim(workspace_key(), Mode.WRITE),), True, prepared)
        found: dict[str, Path] = {}
        claims = [
            *self._paths(effects.reads, "reads", Mode.READ, args, workspace, found),
            *self._paths(effects.writes, "writes", Mode.WRITE, args, workspace, found),
            *self._tables(effects.read_tables, "read_tables", Mode.READ, args, workspace),
            *self._tables(effects.write_tables, "write_tables", Mode.WRITE, args, workspace),
        ]
        for host in effects.net:
            value = template.parse(host).expand(args)
            if value:
                claims.append(Claim(net_key(value), Mode.READ))
        checked = prepared.checked + tuple(
            (field, text, found[key]) for key, field, text in self._texts(args)
        )
        prepared = replace(prepared, checked=checked)
        return CallEffects(tuple(claims), effects.may_write, prepared, paths=found)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        prepared = ctx.analysis
        if not isinstance(prepared, Prepared):  # run without validation (a unit test)
            prepared = self._prepare(args, ctx.workspace)
        _unchanged(prepared, ctx.workspace, ctx.hard_links)
        env, hidden = self._environment(ctx.workspace.root)
        launch = Launch(
            argv=prepared.argv,
            cwd=prepared.cwd,
            env=env,
            stdin=prepared.stdin,
            workspace=ctx.workspace.root,
            writable=ctx.may_write,
            marker=ctx.marker or tokens.token_hex(8),
            confinement=ctx.confinement,
            output_cap=ctx.limits.raw_cap_bytes,
            run_id=ctx.run_id,
        )
        out = _redacted(await run_sandboxed(launch, ctx), hidden)
        return self._judged(out)

    # -- expansion ----------------------------------------------------------------

    def _prepare(self, args: dict[str, Any], workspace: Workspace) -> Prepared:
        argv: list[str] = []
        for item in self.decl.argv:
            spread = template.spread_name(item)
            if spread is not None:
                argv += template.spread(spread, args)
                continue
            value = template.parse(item).expand(args)
            if value is not None:
                argv.append(value)
        cwd_text = template.parse(self.decl.cwd).expand(args) or "."
        cwd_field = _field(self.decl.cwd, "cwd")
        cwd = workspace.resolve(cwd_text, cwd_field)
        stdin = None
        if self.decl.stdin is not None:
            text = template.parse(self.decl.stdin).expand(args)
            stdin = text.encode("utf-8", errors="surrogatepass") if text is not None else None
        return Prepared(tuple(argv), cwd, stdin, ((cwd_field, cwd_text, cwd),))

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
            value = _path_text(text, args, f"effects.{key}[{i}]")
            if value is None:
                continue
            path = workspace.resolve(value, _field(text, f"effects.{key}[{i}]"))
            found[f"effects.{key}[{i}]"] = path
            claims.append(Claim(path_key(workspace.relative(path)), mode))
        return claims

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
            value = _path_text(text, args, f"effects.{key}[{i}]")
            if value is None:
                continue
            db, _, table = value.rpartition(":")
            path = workspace.resolve(db or ".", _field(text, f"effects.{key}[{i}]"))
            rel = workspace.relative(path)
            if rel in ("", "."):
                raise ToolError(
                    ErrorClass.INVALID_ARGUMENT,
                    f"{value!r}: a table's database must be a file",
                    field=_field(text, f"effects.{key}[{i}]"),
                    status=Status.REJECTED,
                )
            claims.append(Claim(table_key(rel, table), mode))
        return claims

    def _texts(self, args: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(`_paths`' key, the field it names, expanded text) of each effects path given."""
        out = []
        for key in ("reads", "writes"):
            for i, text in enumerate(getattr(self.decl.effects, key)):
                where = f"effects.{key}[{i}]"
                value = _path_text(text, args, where)
                if value is not None:
                    out.append((where, _field(text, where), value))
        return out

    # -- environment and result ---------------------------------------------------

    def _environment(self, home: Path) -> tuple[dict[str, str], dict[str, str]]:
        """The child's environment, and each secret's value -> its name (to redact)."""
        env = {**BASE_ENV, "HOME": str(home), **dict(self.decl.env.set)}
        for name in self.decl.env.passthrough:
            if name in self._environ:
                env[name] = self._environ[name]
        hidden: dict[str, str] = {}
        for child, source in self.decl.env.secrets:
            value = self._environ.get(source)
            if value is None:  # gone since validation
                raise ToolError(
                    ErrorClass.NOT_FOUND,
                    f"secret {child}: the daemon's environment has no {source}",
                    field=f"secrets.{child}",
                )
            env[child] = value
            if value:
                hidden[value] = child
                # As JSON writes it (`output: json` parses stdout after the cut).
                for form in (json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
                    hidden.setdefault(form, child)
        return env, hidden

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


def _redacted(out: ToolOutput, hidden: dict[str, str]) -> ToolOutput:
    """Every secret value in the output replaced by `[secret NAME]` (longest first, so
    a secret that contains another is cut whole)."""
    if not hidden:
        return out
    text, message = out.text, out.message
    for value in sorted(hidden, key=len, reverse=True):
        mask = f"[secret {hidden[value]}]"
        text, message = text.replace(value, mask), message.replace(value, mask)
        if out.truncated:
            text = _cut_tails(text, value, mask)
    return replace(out, text=text, message=message)


_STDERR = "\n[stderr]\n"  # between stdout and stderr in `text` (command._output)


def _cut_tails(text: str, value: str, mask: str) -> str:
    """A stream the raw cap cut mid-secret ends with a part of it: masked too. The end
    of stdout is before the stderr line, the end of stderr (or of stdout) the text's."""
    for k in range(len(value) - 1, 0, -1):
        part = value[:k]
        if text.endswith(part):
            text = text[: -len(part)] + mask
        text = text.replace(part + _STDERR, mask + _STDERR)
    return text


def _field(text: str, fallback: str) -> str:
    """The argument a template names (`arguments.path`), or where it is declared."""
    names = template.parse(text).names
    return f"arguments.{names[0]}" if names else fallback


def _path_text(text: str, args: dict[str, Any], where: str) -> str | None:
    """An effects path template expanded for the check. None when none of its arguments
    is given; REJECTED when only some are (the path checked would not be the one the
    command gets), or when a value not at the template's start is absolute (`{dir}/{name}`
    with name `/x` checks `dir//x` while the command is handed `/x`)."""
    parsed = template.parse(text)
    given = [n for n in parsed.names if args.get(n) is not None]
    if not given:
        return None
    missing = [n for n in parsed.names if n not in given]
    if missing:
        raise ToolError(
            ErrorClass.INVALID_ARGUMENT,
            f"{where} ({text!r}) needs {missing[0]} with {given[0]}: the path cannot be checked",
            field=f"arguments.{missing[0]}",
            status=Status.REJECTED,
        )
    for at, (is_arg, name) in enumerate(parsed.parts):
        if is_arg and at > 0 and template.render(args[name]).startswith("/"):
            raise ToolError(
                ErrorClass.PERMISSION_DENIED,
                f"{where} ({text!r}): {name} must be a relative path inside it",
                field=f"arguments.{name}",
                status=Status.REJECTED,
            )
    return parsed.expand(args)


def _unchanged(
    prepared: Prepared, workspace: Workspace, hard_links: Callable[[Path], bool]
) -> None:
    """Each path checked at validation resolves as it did then (now, under the call's
    locks): a symlink made meanwhile is REJECTED naming its argument, never followed.
    A regular file with several hard links is outside, as for the built-ins, unless
    the policy's `hard_links:` allows it there."""
    for field, text, path in prepared.checked:
        if workspace.resolve(text, field) != path:
            raise ToolError(
                ErrorClass.PERMISSION_DENIED,
                f"{text!r} changed since the call was checked (a symlink?)",
                field=field,
                status=Status.REJECTED,
            )
        try:
            st = os.stat(path)
        except OSError:
            continue  # not there (yet): nothing links to it
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and not hard_links(path):
            raise hard_link_refused(workspace.relative(path), st.st_nlink, field)
