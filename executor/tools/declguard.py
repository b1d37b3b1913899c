"""What a declared tool checks around its run: the effects paths it was validated
with (each path template given whole; resolved again, under the call's locks, when it
starts) and the secrets cut from what it printed.

`declared` (command tools) and `mcp` (a server's overrides; everything a server
process writes) call these; they hold no state.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from execgate.executor.core.errors import ToolError, invalid
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.core.paths import Workspace, hard_link_refused
from execgate.executor.locks import Claim, Mode, net_key, table_key

from . import template
from .base import ToolOutput

__all__ = [
    "cut",
    "cut_json",
    "field_of",
    "masks",
    "net_claim",
    "not_an_option",
    "path_text",
    "redacted",
    "secret_forms",
    "table_claim",
    "unchanged",
]

Checked = tuple[tuple[str, str, Path], ...]


def secret_forms(value: str) -> tuple[str, ...]:
    """The secret as it is and as JSON writes it (`output: json` parses stdout after
    the cut; a server's result is JSON text), each form to be cut."""
    return (value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1])


def masks(named: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Each form of each secret's value -> the secret's name: what `cut` replaces.
    `named`: (name, value) pairs; an empty value hides nothing."""
    hidden: dict[str, str] = {}
    for name, value in named:
        for form in secret_forms(value) if value else ():
            hidden.setdefault(form, name)
    return hidden


def cut(text: str, hidden: Mapping[str, str], *, truncated: bool = False) -> str:
    """Every secret value in `text` replaced by `[secret NAME]` (longest first, so a
    secret that contains another is cut whole). `truncated`: a cap cut the text, so
    it may end with a part of a secret, masked too."""
    for value in sorted(hidden, key=len, reverse=True):
        mask = f"[secret {hidden[value]}]"
        text = text.replace(value, mask)
        if truncated:
            text = _cut_tails(text, value, mask)
    return text


def cut_json(value: Any, hidden: Mapping[str, str]) -> Any:
    """`cut` on every string of a JSON value (object keys too), a new value."""
    if not hidden:
        return value
    if isinstance(value, str):
        return cut(value, hidden)
    if isinstance(value, list):
        return [cut_json(item, hidden) for item in value]
    if isinstance(value, dict):
        return {cut(str(k), hidden): cut_json(v, hidden) for k, v in value.items()}
    return value


def redacted(out: ToolOutput, hidden: Mapping[str, str]) -> ToolOutput:
    """`cut` on the output's text, message and structured result."""
    if not hidden:
        return out
    return replace(
        out,
        text=cut(out.text, hidden, truncated=out.truncated),
        message=cut(out.message, hidden),
        structured=cut_json(out.structured, hidden),
    )


_STDERR = "\n[stderr]\n"  # between stdout and stderr in `text` (command._output)


def _cut_tails(text: str, value: str, mask: str) -> str:
    """A stream the raw cap cut mid-secret ends with a part of it (then perhaps U+FFFD,
    for a character the cap cut in two): masked too. The end of stdout is before the
    stderr line, the end of stderr (or of stdout) the text's."""
    for k in range(len(value) - 1, 0, -1):
        part = value[:k]
        for end in (part, part + "\ufffd"):
            if text.endswith(end):
                text = text[: -len(end)] + mask
            text = text.replace(end + _STDERR, mask + _STDERR)
    return text


def path_text(text: str, args: dict[str, Any], where: str) -> str | None:
    """An effects path template expanded for the check (a literal one as it is). None
    when none of its arguments is given; REJECTED when only some are (the path checked
    would not be the one the command gets), or when a value not at the template's start
    is absolute (`{dir}/{name}` with name `/x` checks `dir//x` while the command is
    handed `/x`)."""
    parsed = template.parse(text)
    given = [n for n in parsed.names if args.get(n) is not None]
    if parsed.names and not given:
        return None
    for name in given:  # an array's JSON text is not any path the command is handed
        if isinstance(args[name], (list, dict, bool)):
            raise ToolError(
                ErrorClass.INVALID_ARGUMENT,
                f"{where} ({text!r}): {name} must be a string or a number to be a path",
                field=f"arguments.{name}",
                status=Status.REJECTED,
            )
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


def field_of(text: str, fallback: str) -> str:
    """The argument a template names (`arguments.path`), or where it is declared."""
    names = template.parse(text).names
    return f"arguments.{names[0]}" if names else fallback


def table_claim(value: str, field: str, mode: Mode, workspace: Workspace) -> Claim:
    """The claim on an expanded `DATABASE_PATH:TABLE`: its database resolved inside
    the workspace (an escape is REJECTED naming `field`), which must name a file."""
    db, _, table = value.rpartition(":")
    path = workspace.resolve(db or ".", field)
    rel = workspace.relative(path)
    if rel in ("", "."):
        raise ToolError(
            ErrorClass.INVALID_ARGUMENT,
            f"{value!r}: a table's database must be a file",
            field=field,
            status=Status.REJECTED,
        )
    try:
        return Claim(table_key(workspace.lock_root, rel, table), mode)
    except ValueError as exc:  # no table name
        raise invalid(f"{value!r}: {exc}", field) from exc


def net_claim(value: str, field: str) -> Claim | None:
    """The READ claim on an expanded `net:` host (None: the call gave an empty one);
    REJECTED naming `field` when it names no host (`.`)."""
    if not value:
        return None
    try:
        return Claim(net_key(value), Mode.READ)
    except ValueError as exc:
        raise invalid(f"{value!r} is not a host name: {exc}", field) from exc


def unchanged(checked: Checked, workspace: Workspace, hard_links: Callable[[Path], bool]) -> None:
    """Each path checked at validation resolves as it did then (now, under the call's
    locks): a symlink made meanwhile is REJECTED naming its argument, never followed.
    A regular file with several hard links is outside, as for the built-ins, unless
    the policy's `hard_links:` allows it there."""
    for field, text, path in checked:
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


def not_an_option(value: str, name: str | None, field: str, allowed: tuple[str, ...]) -> None:
    """An argv element that an argument makes start with `-` is REJECTED (the program
    would read it as an option: `-rf`, `--output=/etc/passwd`), unless the tools file
    lists the argument in `option_args` or puts a `--` element before it."""
    if name is None or not value.startswith("-") or name in allowed:
        return
    raise ToolError(
        ErrorClass.INVALID_ARGUMENT,
        f"{field} starts with '-', so the program would read it as an option (the tools "
        f"file can put '--' before it in argv, or list {name} in option_args)",
        field=field,
        status=Status.REJECTED,
    )
