"""Exceptions of the model adapters. Each carries the `model` name and says what happened.

    ExecgateClientError            root of the client (execgate.client.errors)
    └── ModelError                 root of execgate.client.models
        ├── ModelUnavailable       nothing answered usefully: connection refused, timeout,
        │                          5xx (Anthropic's 529 overloaded_error among them); retry later
        ├── ModelRateLimited       429; `retry_after` seconds when the provider said, else None
        ├── ModelRequestRejected   any other 4xx: the request is wrong (bad key, bad model,
        │                          bad schema); carries `status`, `error_type`, the provider's
        │                          `provider_message`; retrying will not help
        ├── ModelBadResponse       a 2xx whose body we cannot use: not JSON, a missing field, an
        │                          unknown tool-call shape, arguments that are not JSON
        └── ScriptExhausted        a ScriptedModel was asked for more turns than its script has

No message ever contains an api key: adapters redact it from anything a server echoes.
"""

from __future__ import annotations

from ..errors import ExecgateClientError


class ModelError(ExecgateClientError):
    """Root of the model exceptions."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__(f"model {model!r}: {message}")
        self.model = model


class ModelUnavailable(ModelError):
    def __init__(self, model: str, reason: str, *, status: int | None = None) -> None:
        super().__init__(model, f"unavailable: {reason}")
        self.reason = reason
        # The HTTP status when there was one (5xx); None for connection errors and timeouts.
        self.status = status


class ModelRateLimited(ModelError):
    def __init__(self, model: str, retry_after: float | None, message: str = "") -> None:
        wait = f"retry after {retry_after:g}s" if retry_after is not None else "no retry-after"
        super().__init__(model, f"rate limited (429, {wait})" + (f": {message}" if message else ""))
        self.retry_after = retry_after
        self.provider_message = message


class ModelRequestRejected(ModelError):
    def __init__(self, model: str, status: int, message: str, *, error_type: str = "") -> None:
        kind = f" {error_type}" if error_type else ""
        super().__init__(model, f"request rejected (HTTP {status}{kind}): {message}")
        self.status = status
        self.error_type = error_type
        self.provider_message = message


class ModelBadResponse(ModelError):
    def __init__(self, model: str, what: str) -> None:
        super().__init__(model, f"bad response: {what}")
        self.what = what


class ScriptExhausted(ModelError):
    def __init__(self, model: str, turns: int) -> None:
        super().__init__(model, f"the script has {turns} turn(s) and all were used")
        self.turns = turns
