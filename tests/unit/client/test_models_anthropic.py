"""AnthropicMessagesModel against a local server speaking the Messages API."""

from __future__ import annotations

import time

import pytest

from execgate.client.models import (
    AnthropicMessagesModel,
    Message,
    ModelBadResponse,
    ModelRateLimited,
    ModelRequestRejected,
    ModelTool,
    ModelUnavailable,
    Pricing,
    ToolCall,
    ToolResult,
)
from tests.model_server import (  # noqa: F401 (the model_server and closed_port fixtures)
    ModelServer,
    assert_secret_hidden,
    closed_port_fixture,
    model_server_fixture,
)

KEY = "sk-ant-api03-test-Zq4Xw8Rt2Yv6Uo0Pi3Lk7Jh1Gf5Ds9Aa"
READ = ModelTool(
    "read_file",
    "Read a UTF-8 file of the workspace.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)


def claude(server: ModelServer, **kwargs: object) -> AnthropicMessagesModel:
    options: dict[str, object] = {"base_url": server.url, "api_key": KEY}
    return AnthropicMessagesModel("claude-sonnet-4", **(options | kwargs))  # type: ignore[arg-type]


def ask(model: AnthropicMessagesModel) -> None:
    model.respond([Message("user", "hello")], [READ])


# ---------------------------------------------------------------- parsing


def test_tool_use_text_usage_and_cost_are_parsed(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="anthropic_tool_use")
    turn = claude(model_server, pricing=Pricing(input=3.0, output=15.0)).respond(
        [Message("user", "find the TODOs in src/app.py")], [READ]
    )
    assert turn.text == "I'll read the file and look for TODOs."
    assert turn.tool_calls == (
        ToolCall("toolu_01A09q90qw90lq917835lq9", "read_file", {"path": "src/app.py"}),
        ToolCall(
            "toolu_01BpX4QmZr7Yk2Vd9Ls3Nw8T",
            "search",
            {"pattern": "TODO", "path": "src", "max_results": 20},
        ),
    )
    assert turn.stop_reason == "tool_use"
    assert not turn.final
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (1520, 96)
    assert turn.usage.cost == pytest.approx((1520 * 3.0 + 96 * 15.0) / 1e6)


def test_text_blocks_are_concatenated_into_a_final_answer(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="anthropic_answer")
    turn = claude(model_server).respond([Message("user", "and?")], [])
    assert turn.text == (
        "src/app.py has two TODOs: input validation (line 14) and retry logic (line 52)."
    )
    assert turn.final
    assert turn.stop_reason == "end_turn"
    body = model_server.last.body
    assert "tools" not in body
    assert "system" not in body


# ---------------------------------------------------------------- the request on the wire


def test_a_multi_turn_conversation_follows_the_wire_rules(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="anthropic_answer")
    read = ToolCall("toolu_A", "read_file", {"path": "src/app.py"})
    search = ToolCall("toolu_B", "search", {"pattern": "TODO"})
    conversation = [
        Message("user", "find the TODOs"),
        Message("assistant", "Looking.", tool_calls=(read, search)),
        # Results arrive in completion order; they go back in the calls' order.
        Message(
            "tool_results",
            results=(
                ToolResult("toolu_B", "pattern too broad", is_error=True),
                ToolResult("toolu_A", "# TODO: validate input"),
            ),
        ),
        # A user message right after the results shares their (user) message; results first.
        Message("user", "2 turns left"),
    ]
    claude(model_server, max_tokens=1024).respond(conversation, [READ], system="You are terse.")
    request = model_server.last
    assert (request.method, request.path) == ("POST", "/v1/messages")
    assert request.body == {
        "model": "claude-sonnet-4",
        "max_tokens": 1024,
        "system": "You are terse.",
        "tools": [
            {
                "name": "read_file",
                "description": "Read a UTF-8 file of the workspace.",
                "input_schema": READ.parameters,
            }
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "find the TODOs"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_A",
                        "name": "read_file",
                        "input": {"path": "src/app.py"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_B",
                        "name": "search",
                        "input": {"pattern": "TODO"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_A",
                        "content": "# TODO: validate input",
                        "is_error": False,
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_B",
                        "content": "pattern too broad",
                        "is_error": True,
                    },
                    {"type": "text", "text": "2 turns left"},
                ],
            },
        ],
    }


def test_results_come_first_even_after_a_user_message(model_server: ModelServer) -> None:
    """A user note queued before the results still lands after them in the merged message."""
    model_server.reply(fixture_name="anthropic_answer")
    call = ToolCall("toolu_A", "read_file", {"path": "a"})
    conversation = [
        Message("user", "read a"),
        Message("user", "quickly"),
        Message("assistant", tool_calls=(call,)),
        Message("assistant", ""),  # nothing to say: left out
        Message("user", "note"),
        Message("tool_results", "results text", results=(ToolResult("toolu_A", "aaa"),)),
    ]
    claude(model_server).respond(conversation, [READ])
    messages = model_server.last.body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"] == [
        {"type": "text", "text": "read a"},
        {"type": "text", "text": "quickly"},
    ]
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result", "text", "text"]
    assert [b.get("text") for b in messages[2]["content"][1:]] == ["note", "results text"]


def test_headers_carry_the_key_and_the_api_version(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="anthropic_answer")
    ask(claude(model_server, anthropic_version="2099-01-01"))
    headers = model_server.last.headers
    assert headers["x-api-key"] == KEY
    assert headers["anthropic-version"] == "2099-01-01"
    assert headers["content-type"] == "application/json"
    assert "authorization" not in headers


def test_the_key_defaults_to_the_environment(
    model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    model_server.reply(fixture_name="anthropic_answer")
    model = AnthropicMessagesModel("claude-sonnet-4", base_url=model_server.url)
    ask(model)
    assert model_server.last.headers["x-api-key"] == "sk-ant-from-env"
    assert model_server.last.headers["anthropic-version"] == "2023-06-01"
    assert model_server.last.body["max_tokens"] == 4096
    assert "sk-ant-from-env" not in repr(model)


# ---------------------------------------------------------------- errors


def test_529_overloaded_is_unavailable(model_server: ModelServer) -> None:
    model_server.reply(529, fixture_name="anthropic_error_529")
    with pytest.raises(ModelUnavailable) as info:
        ask(claude(model_server))
    assert info.value.status == 529
    assert "overloaded_error: Overloaded" in str(info.value)
    assert info.value.model == "claude-sonnet-4"
    assert_secret_hidden(info.value, KEY)


def test_500_api_error_is_unavailable(model_server: ModelServer) -> None:
    model_server.reply(500, fixture_name="anthropic_error_500")
    with pytest.raises(ModelUnavailable) as info:
        ask(claude(model_server))
    assert info.value.status == 500
    assert "api_error: Internal server error" in str(info.value)
    assert_secret_hidden(info.value, KEY)


def test_429_is_rate_limited_with_retry_after(model_server: ModelServer) -> None:
    model_server.reply(429, fixture_name="anthropic_error_429", headers={"retry-after": "17"})
    with pytest.raises(ModelRateLimited) as info:
        ask(claude(model_server))
    assert info.value.retry_after == 17.0
    assert "50,000 input tokens per minute" in str(info.value)
    assert len(model_server.requests) == 1  # no retry here: the caller decides
    assert_secret_hidden(info.value, KEY)


def test_400_is_rejected_with_the_providers_message(model_server: ModelServer) -> None:
    model_server.reply(400, fixture_name="anthropic_error_400")
    with pytest.raises(ModelRequestRejected) as info:
        ask(claude(model_server))
    assert info.value.status == 400
    assert info.value.error_type == "invalid_request_error"
    assert "unexpected `tool_use_id` found in `tool_result` blocks" in str(info.value)
    assert_secret_hidden(info.value, KEY)


def test_a_key_a_server_echoes_back_is_redacted(model_server: ModelServer) -> None:
    message = f"invalid x-api-key: {KEY}"
    model_server.reply(
        401, body={"type": "error", "error": {"type": "authentication_error", "message": message}}
    )
    with pytest.raises(ModelRequestRejected) as info:
        ask(claude(model_server))
    assert info.value.error_type == "authentication_error"
    assert "invalid x-api-key: [redacted]" in str(info.value)
    assert_secret_hidden(info.value, KEY)


def test_a_closed_port_is_unavailable(closed_port: int) -> None:
    model = AnthropicMessagesModel(
        "claude-sonnet-4", base_url=f"http://127.0.0.1:{closed_port}", api_key=KEY
    )
    with pytest.raises(ModelUnavailable) as info:
        ask(model)
    assert info.value.status is None
    assert "refused" in str(info.value).lower()
    assert_secret_hidden(info.value, KEY)


def test_a_slow_server_times_out_as_unavailable(model_server: ModelServer) -> None:
    model_server.reply(hang=True, fixture_name="anthropic_answer")
    started = time.monotonic()
    with pytest.raises(ModelUnavailable) as info:
        ask(claude(model_server, timeout=0.3))
    assert time.monotonic() - started < 5
    assert "within 0.3s" in str(info.value)
    assert_secret_hidden(info.value, KEY)


def test_a_body_that_is_not_json_is_a_bad_response(model_server: ModelServer) -> None:
    model_server.reply(raw=b'{"id": "msg_01", "content": [')
    with pytest.raises(ModelBadResponse, match="not JSON") as info:
        ask(claude(model_server))
    assert_secret_hidden(info.value, KEY)


def test_an_unknown_content_block_is_a_bad_response(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="anthropic_unknown_block")
    with pytest.raises(ModelBadResponse, match=r"content\[0\] has unknown type 'server_tool_use'"):
        ask(claude(model_server))


def test_tool_input_that_is_not_an_object_is_a_bad_response(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="anthropic_bad_input")
    with pytest.raises(ModelBadResponse, match=r"content\[0\]\.input is not an object: str"):
        ask(claude(model_server))


def test_a_body_without_content_says_so(model_server: ModelServer) -> None:
    model_server.reply(body={"id": "msg_01", "type": "message", "stop_reason": "end_turn"})
    with pytest.raises(ModelBadResponse, match=r"response\.content is not a list: missing"):
        ask(claude(model_server))
