"""The request guard: a wrapper between gRPC and every servicer method.

Two jobs, both about requests the daemon cannot use:

- **Tolerant decoding.** grpc decodes a request with the message's `FromString`
  before any servicer code runs; bytes that do not decode raise inside grpc, which
  answers UNKNOWN and logs a traceback (one per request: a log-flooding vector).
  The guard swaps in a deserializer that never raises: undecodable bytes become an
  `Undecodable` value, which the guarded method answers with INVALID_ARGUMENT naming
  the method and, where the bytes show it (invalid UTF-8 in a string field), the
  field -- found by walking the wire format against the message's descriptor.
- **Typed refusals.** An exception escaping a method ends it with the status
  `status.RULES` gives its class: a `MalformedRequest` raised anywhere below (wire
  conversion, servicers) becomes INVALID_ARGUMENT with the class and field in the
  trailing metadata (`execgate-error-class`, `execgate-field`) and in the details; one
  the table does not know becomes INTERNAL. Both are logged as one line.

It is no interceptor of its own: the authentication interceptor (auth.py) wraps each
method once with `guarded`, which admits the caller first, so a stranger's garbage is
still UNAUTHENTICATED, and every method of every service is guarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from execgate.executor.core.errors import ExecgateError, MalformedRequest

from .status import INTERNAL, abort_for, rule_for

log = logging.getLogger("execgate.requests")

Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What the tolerant deserializer hands on instead of a message it could not decode."""

    error: MalformedRequest


Admit = Callable[[Context], Awaitable[None]]


def guarded(
    handler: grpc.RpcMethodHandler[Any, Any], method: str, admit: Admit | None = None
) -> Any:
    """`handler` with the tolerant deserializer and the typed refusals, and `admit`
    (authentication: auth.py) run first. One wrapper for both, made once per method by
    the authentication interceptor: each layer of async generator around a streaming
    method costs a few microseconds on every call."""
    kind = ("stream" if handler.request_streaming else "unary") + "_"
    kind += "stream" if handler.response_streaming else "unary"
    behaviour = getattr(handler, kind)
    # A streaming method is an async generator, or a coroutine writing with context.write
    # (grpc's health servicer): the latter is awaited like a unary one. Whatever it is,
    # it runs inside this async wrapper, on the event loop (never in grpc's worker
    # threads, outside the RPC's context): a plain function that is not implemented
    # (the aio health servicer's List) raises there and is answered with its status.
    if inspect.isasyncgenfunction(behaviour):
        wrapped: Any = _streaming(behaviour, method, handler.request_streaming, admit)
    else:
        wrapped = _unary(behaviour, method, handler.request_streaming, admit)
    return getattr(grpc, f"{kind}_rpc_method_handler")(
        wrapped,
        request_deserializer=tolerant(handler.request_deserializer, method),
        response_serializer=handler.response_serializer,
    )


def tolerant(deserializer: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any]:
    """`deserializer`, answering `Undecodable` instead of raising."""
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)

    def decode(data: bytes) -> Any:
        if deserializer is None:
            return data
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, or whatever a foreign deserializer raises
            return Undecodable(_undecodable(method, data, descriptor, exc))

    return decode


def _undecodable(
    method: str, data: bytes, descriptor: Descriptor | None, exc: Exception
) -> MalformedRequest:
    short = method.rpartition("/")[2]
    found = locate(data, descriptor) if descriptor is not None else None
    if found is not None:
        kind, field, why = found
        return MalformedRequest(kind, field, f"{short} request: {why}")
    what = descriptor.full_name if descriptor is not None else "message"
    reason = str(exc).rpartition(": ")[2] or type(exc).__name__
    return MalformedRequest("undecodable", "", f"the {short} request is not a {what}: {reason}")


def _unary(behaviour: Any, method: str, streamed: bool, admit: Admit | None) -> Any:
    async def unary(request: Any, context: Context) -> Any:
        if admit is not None:
            await admit(context)  # a stranger's garbage stays UNAUTHENTICATED
        try:
            return await behaviour(_checked(request, streamed), context)
        except Exception as exc:
            await _refuse(context, method, exc)
            raise

    return unary


def _streaming(behaviour: Any, method: str, streamed: bool, admit: Admit | None) -> Any:
    async def streaming(request: Any, context: Context) -> AsyncIterator[Any]:
        if admit is not None:
            await admit(context)
        try:
            responses = behaviour(_checked(request, streamed), context)
            async with contextlib.aclosing(responses):  # closed with the RPC, at once
                async for response in responses:
                    yield response
        except Exception as exc:
            await _refuse(context, method, exc)
            raise

    return streaming


def _checked(request: Any, streamed: bool) -> Any:
    if streamed:
        return _checked_stream(request)
    if isinstance(request, Undecodable):
        raise request.error
    return request


async def _checked_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            raise request.error
        yield request


async def _refuse(context: Context, method: str, exc: Exception) -> None:
    """Answer `exc` with its status (`status.RULES`) and one log line; re-raises grpc's
    own aborts."""
    if isinstance(exc, grpc.aio.AbortError | asyncio.CancelledError):
        return
    if isinstance(exc, MalformedRequest):
        log.warning(
            "malformed %s from %s: class=%s field=%s: %s",
            method, context.peer(), exc.kind, exc.field or "-", _one_line(exc.message),
        )  # fmt: skip
    elif rule_for(exc) is INTERNAL:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "?"
        log.error("internal error in %s: %s: %s at %s", method, type(exc).__name__,
                  _one_line(str(exc)), where)  # fmt: skip
    await abort_for(context, exc, method)


def _one_line(text: str) -> str:
    return text.replace("\n", " ").replace("\r", " ")[:500]


# ---------------------------------------------------------------- where the bytes go wrong


class _Corrupt(ExecgateError):
    """The wire format breaks here; caught by `locate`, which then names nothing."""


def locate(data: bytes, descriptor: Descriptor) -> tuple[str, str, str] | None:
    """(class, field path, why) of the first string field holding invalid UTF-8, or of
    the field where the wire format breaks; None if the walk finds nothing to name."""
    try:
        return _walk(data, descriptor, "")
    except Exception:  # _Corrupt, or anything else: it runs inside grpc's deserializer
        return None


def _walk(
    data: bytes | memoryview, descriptor: Descriptor, prefix: str
) -> tuple[str, str, str] | None:
    view = memoryview(data)
    pos, seen = 0, dict[int, int]()
    while pos < len(view):
        key, pos = _varint(view, pos)
        number, wire_type = key >> 3, key & 7
        field = descriptor.fields_by_number.get(number)
        name = prefix + (field.name if field is not None else f"#{number}")
        if field is not None and field.is_repeated:
            name += f"[{seen.get(number, 0)}]"
            seen[number] = seen.get(number, 0) + 1
        if wire_type == 0:
            _, pos = _varint(view, pos)
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        elif wire_type == 2:
            size, pos = _varint(view, pos)
            chunk = view[pos : pos + size]
            if len(chunk) < size:
                return "undecodable", "", f"{name}: its length runs past the message's end"
            pos += size
            found = _inside(chunk, field, name)
            if found is not None:
                return found
        else:
            raise _Corrupt
    if pos > len(view):
        raise _Corrupt
    return None


def _inside(
    chunk: memoryview, field: FieldDescriptor | None, name: str
) -> tuple[str, str, str] | None:
    if field is None:
        return None
    if field.type == FieldDescriptor.TYPE_STRING:
        try:
            bytes(chunk).decode("utf-8")
        except UnicodeDecodeError:
            return "invalid_utf8", name, f"{name}: not valid UTF-8"
        return None
    if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
        return _walk(chunk, field.message_type, name + ".")
    return None


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(10):
        if pos + i >= len(view):
            raise _Corrupt
        byte = view[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise _Corrupt
