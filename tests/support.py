"""Helpers shared by the integration tests: waiting on observable state, streaming in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from execgate.client import Call, Client, Event, EventKind, ExecgateClientError, Outcome


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


class Streamer:
    """`client.stream(calls)` in a background thread, with its own client; events collected."""

    def __init__(self, address: str, calls: list[Call], **kwargs: object) -> None:
        self.events: list[Event] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(address, calls, kwargs), daemon=True
        )
        self._thread.start()

    def _run(self, address: str, calls: list[Call], kwargs: dict[str, object]) -> None:
        try:
            with Client(address) as c:
                for event in c.stream(calls, **kwargs):  # type: ignore[arg-type]
                    self.events.append(event)
        except ExecgateClientError as exc:  # e.g. the daemon went away under the stream
            self.error = exc

    def seen(self, kind: EventKind, call_id: str) -> bool:
        return any(e.kind is kind and e.call_id == call_id for e in list(self.events))

    def outcome(self, call_id: str) -> Outcome:
        for e in self.events:
            if e.kind is EventKind.FINISHED and e.call_id == call_id:
                assert e.outcome is not None
                return e.outcome
        raise AssertionError(f"no FINISHED event for {call_id}: {self.events}")

    def join(self, timeout: float = 15.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"
