"""The pipeline room: the path of one tool call through the daemon, one module per stage.

`dispatch` drives a batch: `validate`, `authorize` (what the policy sees), `approve` (calls
an `ask` rule parks), `idempotency`, `admission`, the lock plan, `runtool`, `results` (the
one place a status is decided), `endings` for calls that never run their tool, and the
`events` an Execute stream carries; `inflight` is how a Cancel reaches running calls.
It knows nothing of gRPC. Its modules are imported directly, so `__all__` is empty.
"""

__all__: list[str] = []
