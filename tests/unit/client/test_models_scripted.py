"""The model interface, its errors, and ScriptedModel (the fake the loop's tests drive)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from execgate.client.models import (
    Message,
    Model,
    ModelBadResponse,
    ModelError,
    ModelRateLimited,
    ModelRequestRejected,
    ModelTool,
    ModelUnavailable,
    Pricing,
    ScriptedModel,
    ScriptExhausted,
    ToolCall,
    ToolResult,
    Turn,
    Usage,
)

READ = ModelTool("read_file", "Read a file", {"type": "object", "properties": {}})


def test_pricing_is_per_million_tokens() -> None:
    pricing = Pricing(input=3.0, output=15.0)
    assert pricing.cost(1_000_000, 0) == pytest.approx(3.0)
    assert pricing.cost(1000, 500) == pytest.approx(0.003 + 0.0075)
    usage = pricing.usage(1000, 500)
    assert (usage.input_tokens, usage.output_tokens) == (1000, 500)
    assert usage.cost == pytest.approx(0.0105)
    assert Pricing().cost(10**9, 10**9) == 0.0


def test_turn_is_final_exactly_when_it_proposes_no_calls() -> None:
    assert Turn("done", (), Usage()).final
    assert not Turn("", (ToolCall("c", "read_file", {}),), Usage()).final


def test_messages_keep_calls_and_results_where_they_belong() -> None:
    call = ToolCall("c1", "read_file", {})
    with pytest.raises(ValueError, match="user message cannot carry tool calls"):
        Message("user", tool_calls=(call,))
    with pytest.raises(ValueError, match="assistant message cannot carry tool results"):
        Message("assistant", results=(ToolResult("c1", "x"),))
    assert Message("assistant", tool_calls=(call,)).tool_calls == (call,)


def test_calls_get_ids_unique_across_the_script() -> None:
    model = ScriptedModel(
        [
            ScriptedModel.calls(("read_file", {"path": "a"}), ("read_file", {"path": "b"})),
            ScriptedModel.calls(("search", {"pattern": "x"})),
        ]
    )
    first = model.respond([Message("user", "go")], [READ])
    second = model.respond([Message("user", "go")], [READ])
    assert [c.id for c in first.tool_calls] == ["call_1", "call_2"]
    assert second.tool_calls == (ToolCall("call_3", "search", {"pattern": "x"}),)
    assert first.stop_reason == "tool_calls"
    assert not first.final


def test_explicit_ids_are_kept_and_never_handed_out_again() -> None:
    model = ScriptedModel(
        [
            Turn("", (ToolCall("call_1", "read_file", {}),), Usage()),
            ScriptedModel.calls(("read_file", {})),
        ]
    )
    assert model.respond([], []).tool_calls[0].id == "call_1"
    assert model.respond([], []).tool_calls[0].id == "call_2"


def test_a_callable_step_reacts_to_the_results_it_is_sent() -> None:
    def summarise(messages: Sequence[Message]) -> Turn:
        result = messages[-1].results[0]
        return ScriptedModel.answer(f"the file says {result.content!r}")

    model = ScriptedModel([ScriptedModel.calls(("read_file", {"path": "a"})), summarise])
    turn = model.respond([Message("user", "read a")], [READ])
    conversation = [
        Message("user", "read a"),
        Message("assistant", tool_calls=turn.tool_calls),
        Message("tool_results", results=(ToolResult(turn.tool_calls[0].id, "hello"),)),
    ]
    answer = model.respond(conversation, [READ])
    assert answer.text == "the file says 'hello'"
    assert answer.final
    assert answer.stop_reason == "stop"


def test_requests_record_what_the_model_saw_each_time() -> None:
    model = ScriptedModel([ScriptedModel.answer("a"), ScriptedModel.answer("b")])
    conversation = [Message("user", "one")]
    model.respond(conversation, [READ], system="be brief")
    conversation.append(Message("user", "two"))
    model.respond(conversation, [])
    assert model.requests == [
        (Message("user", "one"),),
        (Message("user", "one"), Message("user", "two")),
    ]
    assert model.tools_offered == [(READ,), ()]
    assert model.systems == ["be brief", ""]
    assert model.remaining == 0


def test_past_the_end_of_the_script_it_raises() -> None:
    model = ScriptedModel([ScriptedModel.answer("only")], name="tiny")
    model.respond([], [])
    with pytest.raises(ScriptExhausted) as info:
        model.respond([Message("user", "more?")], [])
    assert info.value.model == "tiny"
    assert info.value.turns == 1
    assert "1 turn(s)" in str(info.value)
    assert isinstance(info.value, ModelError)
    assert len(model.requests) == 2  # the refused request is still recorded


def test_pricing_prices_the_scripted_tokens_and_otherwise_usage_is_kept() -> None:
    usage = Usage(input_tokens=2000, output_tokens=1000, cost=9.0)
    priced = ScriptedModel([ScriptedModel.answer("x", usage=usage)], pricing=Pricing(1.0, 2.0))
    priced_usage = priced.respond([], []).usage
    assert (priced_usage.input_tokens, priced_usage.output_tokens) == (2000, 1000)
    assert priced_usage.cost == pytest.approx(0.004)
    unpriced = ScriptedModel([ScriptedModel.calls(("read_file", {}), usage=usage)])
    assert unpriced.respond([], []).usage == usage


def test_scripted_model_is_a_model() -> None:
    model: Model = ScriptedModel([ScriptedModel.answer("hi")], name="m")
    assert model.name == "m"
    assert model.respond([], []).text == "hi"


@pytest.mark.parametrize(
    ("error", "fields"),
    [
        (ModelUnavailable("m", "refused", status=None), {"reason": "refused", "status": None}),
        (ModelRateLimited("m", 2.5, "slow down"), {"retry_after": 2.5}),
        (
            ModelRequestRejected("m", 400, "bad schema", error_type="invalid_request_error"),
            {"status": 400, "provider_message": "bad schema"},
        ),
        (ModelBadResponse("m", "content is not a list"), {"what": "content is not a list"}),
        (ScriptExhausted("m", 3), {"turns": 3}),
    ],
)
def test_every_model_error_carries_the_model_and_its_fields(
    error: ModelError, fields: dict[str, Any]
) -> None:
    assert isinstance(error, ModelError)
    assert error.model == "m"
    assert str(error).startswith("model 'm': ")
    for name, value in fields.items():
        assert getattr(error, name) == value


def test_models_do_not_import_the_daemon() -> None:
    code = (
        "import sys, execgate.client.models; "
        "print(sorted(m for m in sys.modules if m.startswith('execgate.executor')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == "[]"
