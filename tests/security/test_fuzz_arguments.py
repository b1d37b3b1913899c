"""Fuzzing the tools' argument validation: any arguments, a typed answer, nothing else.

In-process (fast, many examples): `Validator.validate` over every tool with arguments
drawn from each tool's own property names and hostile values (paths with `..`, NUL,
absolute, over-long, lone surrogates; deep nesting; wrong types) either accepts the
call or raises a REJECTED `ToolError` naming a field -- never another exception.

Through a real daemon (fewer examples): the same arguments as raw `arguments_json`
come back as a typed outcome that the journal holds, and the daemon keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execgate.client import Call, Client, Status
from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import Status as DaemonStatus
from execgate.executor.core.paths import Workspace
from execgate.executor.pipeline.calls import CallRequest
from execgate.executor.pipeline.validate import Validator
from execgate.executor.tools import Limits, builtin_tools
from tests.daemon import Daemon
from tests.security.budget import fuzzing

TOOLS = builtin_tools(test_tools=True)
NAMES = sorted(TOOLS)

HOSTILE_PATHS = st.sampled_from(
    [
        "..",
        "../outside",
        "/etc/passwd",
        "a/../../b",
        "a\x00b",
        "",
        ".",
        "//",
        "x" * 256,
        "a/" * 2100,
        "\udcff",
        "link/../..",
        "~root",
        "%2e%2e/x",
    ]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
    | HOSTILE_PATHS
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def arguments(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    tool = draw(st.sampled_from(NAMES))
    props = list(TOOLS[tool].spec.input_schema.get("properties", {}))
    keys = draw(st.lists(st.sampled_from(props) | st.text(max_size=6), max_size=len(props) + 2))
    return tool, {k: draw(JSON) for k in keys}


@pytest.fixture(scope="module")
def validator(tmp_path_factory: pytest.TempPathFactory) -> Validator:
    root = tmp_path_factory.mktemp("fuzz-args")
    (root / "ws").mkdir()
    return Validator(TOOLS, Workspace(root / "ws"), Limits())


def refusal(validator: Validator, tool: str, text: str) -> ToolError | None:
    """None if the call validates; its ToolError if it is refused; anything else raises."""
    try:
        asyncio.run(validator.validate(_request(tool, text)))
    except ToolError as err:
        return err
    return None


def _request(tool: str, text: str, n: int = 0) -> CallRequest:
    return CallRequest(
        run_id="run", call_id=f"c{n}", batch_id="b", index=0, tool=tool, arguments_json=text
    )


@fuzzing(examples=600)
@given(case=arguments())
def test_validation_accepts_or_rejects_with_a_field(
    validator: Validator, case: tuple[str, dict[str, Any]]
) -> None:
    tool, args = case
    try:
        text = json.dumps(args)
    except (UnicodeEncodeError, ValueError):
        return
    err = refusal(validator, tool, text)
    if err is not None:
        assert err.status is DaemonStatus.REJECTED, err
        assert err.field, err


@fuzzing(examples=200)
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_any_arguments_text_is_accepted_or_rejected_with_a_field(
    validator: Validator, text: str
) -> None:
    for tool in ("read_file", "run_command", "sql"):
        err = refusal(validator, tool, text)
        if err is not None:
            assert err.status is DaemonStatus.REJECTED, err
            assert err.field, err


def test_nesting_far_beyond_the_recursion_limit_is_rejected(validator: Validator) -> None:
    for depth in (1_000, 100_000, 1_000_000):
        text = '{"path": ' + "[" * depth + "]" * depth + "}"
        err = refusal(validator, "read_file", text)
        assert err is not None
        assert (err.status, err.field) == (DaemonStatus.REJECTED, "arguments_json"), err


# ---------------------------------------------------------------- through the daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("fuzz-daemon")).start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def eg(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.address) as c:
        yield c


@fuzzing(examples=40)
@given(cases=st.lists(arguments(), min_size=1, max_size=8))
def test_the_daemon_answers_every_fuzzed_call_typed_and_journaled(
    eg: Client, daemon: Daemon, cases: list[tuple[str, dict[str, Any]]]
) -> None:
    calls = []
    for tool, args in cases:
        try:
            calls.append(Call(tool=tool, arguments=json.dumps(args)))
        except (UnicodeEncodeError, ValueError):
            continue
    if not calls:
        return
    for out in eg.execute(calls):
        assert out.status in tuple(Status), out
        assert out.error_class != "internal", out
        record = eg.get_call(out.call_id)
        assert record.outcome is not None
        assert record.outcome.status is out.status
    assert daemon.serving()
    assert "Traceback" not in Path(daemon.log_path).read_text(errors="replace")
