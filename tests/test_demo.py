"""`execgate demo` end to end: its private daemon, the scripted agent, the transcript."""

from __future__ import annotations

import re
import subprocess
import sys


def test_the_demo_narrates_each_thing_it_promises() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # Two reads ran without either waiting for the other.
    assert "call s1c1 finished success" in out
    assert "call s1c2 finished success" in out
    assert not re.search(r"call s1c\d waits", out)
    # Two writes to one file: the second waited behind the first, then ran.
    assert re.search(r"call s2c2 waits its turn behind \S+/s2c1", out)
    # A call parked for approval, decided by the second identity, then run.
    assert re.search(r"call s3c1 awaiting approval appr_\w+", out)
    assert "approver approved" in out
    assert "running_tools -> awaiting_approval" in out
    assert "call s3c1 finished success" in out
    # The SIGTERM-ignoring command: grace expired, then forced, with the times.
    forced = re.search(
        r"call s4c1 finished (\w+)/timeout, force_terminated \(signal sent; "
        r"grace_expired \+([\d.]+)s, force_terminated \+([\d.]+)s",
        out,
    )
    assert forced is not None, out
    assert 0.4 <= float(forced.group(2)) <= 1.5  # the demo policy's grace_s: 0.5
    # The run's terminal reason.
    assert re.search(r"run run_\w+ ended completed: final answer accepted", out)
