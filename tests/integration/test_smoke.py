import pytest

from execgate.client import Client, Status
from tests.daemon import Daemon

# Runs on each journal store: SQLite, and PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.journals, pytest.mark.usefixtures("journal_store")]


def test_read_file_roundtrip(daemon: Daemon, client: Client) -> None:
    (daemon.workspace / "a.txt").write_text("hello\n")
    outcome = client.execute_one("read_file", path="a.txt")
    assert outcome.status is Status.SUCCESS
    assert outcome.text == "hello\n"
    record = client.get_call(outcome.call_id)
    assert record.outcome is not None
    assert record.outcome.status is Status.SUCCESS
