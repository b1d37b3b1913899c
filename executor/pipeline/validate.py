"""Validation: is this a well-formed call to a tool we have, with arguments its schema accepts?

Every failure is a `ToolError` with status REJECTED, an error class and the
offending field, so a caller (or a model) knows exactly what to fix.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping
from typing import Any, cast

from jsonschema.exceptions import ValidationError, best_match

from execgate.executor.core.errors import ToolError, invalid
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.core.paths import Workspace
from execgate.executor.core.requests import (
    DEFAULT_WORKSPACE,
    MAX_ID_CHARS,
    MAX_JSON_DEPTH,
    nested_deeper,
)
from execgate.executor.locks import plan
from execgate.executor.tools import Limits, ResourceKind, Tool, schemabound
from execgate.executor.tools.base import CheckedTool
from execgate.executor.tools.effects import analyse
from execgate.executor.tools.toolset import ToolSet, Traits

from .calls import CallRequest, ValidCall


class Validator:
    def __init__(
        self, tools: Mapping[str, Tool] | ToolSet, workspace: Workspace, limits: Limits
    ) -> None:
        # The tools served now; a reload replaces it whole (one assignment). Each call
        # reads it once and keeps the Tool it found.
        self.toolset = ToolSet.of(tools)
        self.workspace = workspace
        self.limits = limits

    @property
    def tools(self) -> Mapping[str, Tool]:
        return self.toolset.tools

    async def validate(self, req: CallRequest, workspace: Workspace | None = None) -> ValidCall:
        """The call, checked and analysed in `workspace` (the daemon's own if None);
        raises a REJECTED ToolError naming the field.

        A tool that analyses its arguments itself (`sql` reads the database's
        schema) does so in a worker thread: it may block on the file.
        """
        ws = self.workspace if workspace is None else workspace
        check_id(req.call_id, "call_id")
        check_id(req.run_id, "run_id")
        check_id(req.idempotency_key, "idempotency_key")
        toolset = self.toolset  # once: the whole call sees one set
        tool = toolset.get(req.tool)
        if tool is None:
            raise ToolError(
                ErrorClass.UNKNOWN_TOOL,
                f"no tool named {req.tool[:100]!r}",
                field="tool",
                status=Status.REJECTED,
            )
        traits = toolset.traits[req.tool]
        args = parse_arguments(req.arguments_json, self.limits.max_arguments_bytes)
        if traits.patterned:  # its patterns may take their budget: not here
            size = len(req.arguments_json)
            await asyncio.to_thread(self._check_bounded, traits, args, size)
        else:
            self._check_schema(traits, args)
        if traits.checked:
            cast(CheckedTool, tool).check(args)
        paths = self._resolve_paths(tool, args, ws)
        analysed = traits.analysed
        if traits.blocking:
            effects = await asyncio.to_thread(analyse, tool, args, paths, ws, analysed)
        else:
            effects = analyse(tool, args, paths, ws, analysed)
        if effects.paths:
            paths = {**paths, **effects.paths}
        return ValidCall(
            request=req,
            workspace=ws,
            tool=tool,
            args=args,
            # Only idempotency compares hashes; skip the work on the common path.
            request_hash=_hash_or_reject(req.tool, args, ws.name) if req.idempotency_key else "",
            timeout=self._timeout(req.timeout, traits),
            paths=paths,
            effects=effects,
            lock_plan=plan(effects.claims),
            placement=traits.placement,
        )

    @classmethod
    def _check_bounded(cls, traits: Traits, args: dict[str, Any], size: int) -> None:
        """`_check_schema` with the schema's patterns under the call's budget."""
        with schemabound.budget(size):
            cls._check_schema(traits, args)

    @staticmethod
    def _check_schema(traits: Traits, args: dict[str, Any]) -> None:
        schema = traits.validator
        try:
            if traits.fast is not None and traits.fast(args):  # compiled once per tool
                return
            if schema.is_valid(args):  # the common case, without building error objects
                return
            error = best_match(schema.iter_errors(args))
        except RecursionError as exc:  # the error message reprs the offending value
            raise invalid("arguments_json is nested too deeply", "arguments_json") from exc
        if error is not None:
            raise invalid(_describe(error), _field(error))

    def _timeout(self, asked: float | None, traits: Traits) -> float:
        """The call's ask, capped by the daemon's max; a declared tool's `timeout_s` is
        its default and its ceiling (still under the daemon's max)."""
        declared = traits.placement.timeout if traits.placement is not None else None
        cap = (
            self.limits.max_timeout if declared is None else min(declared, self.limits.max_timeout)
        )
        if asked is None or asked <= 0:
            return cap if declared is not None else self.limits.default_timeout
        return min(asked, cap)

    @staticmethod
    def _resolve_paths(tool: Tool, args: dict[str, Any], ws: Workspace) -> dict[str, Any]:
        """Resolve path arguments now, so an escape is REJECTED before anything starts."""
        paths = {}
        for res in tool.spec.resources:
            if res.kind in (ResourceKind.FILE, ResourceKind.TREE):
                raw = args.get(res.argument, ".")
                paths[res.argument] = ws.resolve(raw, f"arguments.{res.argument}")
        return paths


def check_id(value: str, field: str) -> None:
    if len(value) > MAX_ID_CHARS:
        raise invalid(f"{field} is longer than {MAX_ID_CHARS} characters", field)
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise invalid(f"{field} contains control characters", field)


def parse_arguments(text: str, max_bytes: int) -> dict[str, Any]:
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        raise ToolError(
            ErrorClass.RESOURCE_EXHAUSTED,
            f"arguments_json is {size} bytes; the limit is {max_bytes}",
            field="arguments_json",
            status=Status.REJECTED,
        )
    if text.strip() == "":
        return {}
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise invalid(f"arguments_json is not valid JSON: {exc}", "arguments_json") from exc
    except RecursionError as exc:
        raise invalid(_TOO_DEEP, "arguments_json") from exc
    except ValueError as exc:
        raise invalid(f"arguments_json is not acceptable JSON: {exc}", "arguments_json") from exc
    if not isinstance(value, dict):
        raise invalid("arguments_json must be a JSON object", "arguments_json")
    if nested_deeper(value):
        raise invalid(_TOO_DEEP, "arguments_json")
    if "\\u" not in text:  # no escapes: the text was valid UTF-8, so is the value
        return value
    try:
        # A \uD800-style escape decodes to a lone surrogate, which no path, file
        # content or argv can hold; refuse it here rather than crash a tool. (This
        # also proves the value can be re-encoded, as request_hash must.)
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(
            "arguments_json contains a lone surrogate escape (not valid Unicode)", "arguments_json"
        ) from exc
    except RecursionError as exc:
        raise invalid("arguments_json is nested too deeply", "arguments_json") from exc
    return value


_TOO_DEEP = f"arguments_json is nested deeper than {MAX_JSON_DEPTH} levels"


def _hash_or_reject(tool: str, args: dict[str, Any], workspace: str) -> str:
    try:
        return request_hash(tool, args, workspace)
    except RecursionError as exc:
        raise invalid("arguments_json is nested too deeply", "arguments_json") from exc


def request_hash(tool: str, args: dict[str, Any], workspace: str = DEFAULT_WORKSPACE) -> str:
    """The same call in another workspace is another request; in `default` the hash is
    the one a daemon of a single workspace gave it (a journal's keys stay valid)."""
    request: list[Any] = [tool, args] if workspace == DEFAULT_WORKSPACE else [tool, args, workspace]
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", errors="surrogatepass")).hexdigest()


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _field(error: ValidationError) -> str:
    """The offending argument as `arguments.argv[1]`, `arguments.env.NAME`, ..."""
    path: list[str | int] = list(error.absolute_path)
    if error.validator == "required":
        required = cast(list[str], error.validator_value)
        instance = cast(Mapping[str, Any], error.instance)
        missing = next((n for n in required if n not in instance), "")
        path.append(missing)
    elif error.validator == "additionalProperties":
        instance = cast(Mapping[str, Any], error.instance)
        schema = cast(Mapping[str, Any], error.schema)
        extra = sorted(set(instance) - set(schema.get("properties", {})))
        path.append(extra[0] if extra else "")
    text = "arguments"
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if part != "" else ""
    return text


def _describe(error: ValidationError) -> str:
    where = _field(error)
    if error.validator == "additionalProperties":
        return f"{where}: unknown argument"
    if error.validator == "required":
        return f"{where}: required argument is missing"
    return f"{where}: {error.message[:300]}"
