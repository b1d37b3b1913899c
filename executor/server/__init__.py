"""The server room: the gRPC edge of the daemon, wiring and no call logic.

Listeners, health, reflection and signals (`serve`), the servicers (`services`,
`runs_service`), the interceptors that authenticate callers (`auth`) and guard requests
(`guard`), protobuf to and from the daemon's dataclasses (`wire`, `wirecheck`), and the one
table from daemon errors to gRPC statuses (`status`). Only `cli` imports it, through its
modules directly, so `__all__` is empty.
"""

__all__: list[str] = []
