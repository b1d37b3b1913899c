"""The security corpus (issue 13): hostile input, path races, privilege and scope checks."""

from collections.abc import Iterator

import pytest

from tests.daemon import Daemon
from tests.security.rawrpc import RawClient


@pytest.fixture(scope="module")
def raw(daemon: Daemon) -> Iterator[RawClient]:
    """Raw bytes to any method of the module's `daemon` (test_fuzz_requests,
    test_malformed_requests)."""
    client = RawClient(daemon.address)
    yield client
    client.close()
