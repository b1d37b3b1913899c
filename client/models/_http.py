"""POST JSON to a model provider; the one place HTTP failures become `ModelError`s.

Both adapters call `post_json`. Mapping (by status, the same for every provider):
429 → ModelRateLimited; 408 and 5xx (Anthropic's 529 overloaded_error too) →
ModelUnavailable; other 4xx → ModelRequestRejected with the provider's own message;
connection errors and timeouts → ModelUnavailable; a 2xx body that is not a JSON object →
ModelBadResponse. The api key (`secret`) is redacted from any text that goes into an error.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from email.message import Message as Headers
from typing import Any

from .errors import ModelBadResponse, ModelRateLimited, ModelRequestRejected, ModelUnavailable

# How much of a body we quote in an error.
_SNIPPET = 300


def post_json(
    url: str,
    body: Mapping[str, Any],
    *,
    headers: Mapping[str, str],
    model: str,
    timeout: float,
    secret: str = "",
) -> dict[str, Any]:
    """POST `body` as JSON and return the response's JSON object.

    Raises:
        ModelUnavailable, ModelRateLimited, ModelRequestRejected, ModelBadResponse.
    """
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw: bytes = response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            error = _status_error(exc.code, exc.headers, _error_body(exc), model, secret)
        raise error from exc
    except TimeoutError as exc:
        raise ModelUnavailable(model, f"no answer from {url} within {timeout:g}s") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise ModelUnavailable(model, f"no connection to {url} within {timeout:g}s") from exc
        reason = _redact(str(exc.reason), secret)
        raise ModelUnavailable(model, f"cannot reach {url}: {reason}") from exc
    except (OSError, http.client.HTTPException) as exc:
        reason = _redact(f"{type(exc).__name__}: {exc}", secret)
        raise ModelUnavailable(model, f"connection to {url} failed: {reason}") from exc
    return _json_object(raw, model, secret)


def _json_object(raw: bytes, model: str, secret: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        snippet = _redact(_snippet(raw), secret)
        raise ModelBadResponse(model, f"the body is not JSON: {snippet!r}") from None
    if not isinstance(doc, dict):
        raise ModelBadResponse(model, f"the body is JSON but not an object: {type(doc).__name__}")
    return doc


def _error_body(exc: urllib.error.HTTPError) -> bytes:
    """The body of an error response; b"" if even that cannot be read."""
    try:
        body: bytes = exc.read()
    except (OSError, http.client.HTTPException):
        return b""
    return body


def _status_error(
    status: int, headers: Headers, raw: bytes, model: str, secret: str
) -> ModelRateLimited | ModelUnavailable | ModelRequestRejected:
    error_type, message = _provider_error(raw)
    message = _redact(message, secret)
    if status == 429:
        return ModelRateLimited(model, _retry_after(headers.get("retry-after")), message)
    if status >= 500 or status == 408:
        kind = f" {error_type}" if error_type else ""
        return ModelUnavailable(model, f"HTTP {status}{kind}: {message}", status=status)
    return ModelRequestRejected(model, status, message, error_type=error_type)


def _provider_error(raw: bytes) -> tuple[str, str]:
    """(type, message) from an error body.

    OpenAI: {"error": {"message", "type"}}; Anthropic: {"type": "error", "error": {"type",
    "message"}}; some local servers: {"error": "text"}. Anything else: the body itself.
    """
    try:
        doc = json.loads(raw)
    except ValueError:
        return "", _snippet(raw)
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        return str(error.get("type") or ""), str(error.get("message") or _snippet(raw))
    if isinstance(error, str):
        return "", error
    return "", _snippet(raw)


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _snippet(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").strip()
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"


def _redact(text: str, secret: str) -> str:
    return text.replace(secret, "[redacted]") if secret else text
