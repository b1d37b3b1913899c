"""OpenAIChatModel against a local server speaking the Chat Completions API."""

from __future__ import annotations

import email.utils
import time

import pytest

from execgate.client.models import (
    Message,
    ModelBadResponse,
    ModelRateLimited,
    ModelRequestRejected,
    ModelTool,
    ModelUnavailable,
    OpenAIChatModel,
    Pricing,
    ToolCall,
    ToolResult,
)
from tests.model_server import (  # noqa: F401 (the model_server and closed_port fixtures)
    ModelServer,
    assert_secret_hidden,
    closed_port_fixture,
    fixture,
    model_server_fixture,
)

KEY = "sk-test-5f3c9a1e7b2d4c6a8e0f1b3d5c7a9e1f"
READ = ModelTool(
    "read_file",
    "Read a UTF-8 file of the workspace.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
SEARCH = ModelTool(
    "search",
    "Search files for a pattern.",
    {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]},
)


def gpt(server: ModelServer, **kwargs: object) -> OpenAIChatModel:
    options: dict[str, object] = {"base_url": f"{server.url}/v1", "api_key": KEY}
    return OpenAIChatModel("gpt-4o", **(options | kwargs))  # type: ignore[arg-type]


def ask(model: OpenAIChatModel) -> None:
    model.respond([Message("user", "hello")], [READ])


# ---------------------------------------------------------------- parsing


def test_tool_calls_usage_and_cost_are_parsed(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="openai_tool_calls")
    turn = gpt(model_server, pricing=Pricing(input=2.5, output=10.0)).respond(
        [Message("user", "find the TODOs in src/app.py")], [READ, SEARCH]
    )
    assert turn.tool_calls == (
        ToolCall("call_Xq8rT2mPz4LkV9aB1cD3eF5g", "read_file", {"path": "src/app.py"}),
        ToolCall(
            "call_Hn6sW0yJ7uQ2oR4tE8iU1pA3",
            "search",
            {"pattern": "TODO", "path": "src", "max_results": 20},
        ),
    )
    assert turn.text == ""  # content was null
    assert turn.stop_reason == "tool_calls"
    assert not turn.final
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (412, 58)
    assert turn.usage.cost == pytest.approx((412 * 2.5 + 58 * 10.0) / 1e6)


def test_a_text_answer_is_final(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="openai_answer")
    turn = gpt(model_server).respond([Message("user", "and?")], [])
    assert turn.text.startswith("src/app.py has two TODOs")
    assert turn.final
    assert turn.stop_reason == "stop"
    assert turn.usage.cost == 0.0  # no pricing given
    assert "tools" not in model_server.last.body  # none offered, none sent


# ---------------------------------------------------------------- the request on the wire


def test_a_multi_turn_conversation_follows_the_wire_rules(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="openai_answer")
    read = ToolCall("call_A", "read_file", {"path": "src/app.py"})
    search = ToolCall("call_B", "search", {"pattern": "TODO"})
    conversation = [
        Message("user", "find the TODOs"),
        Message("assistant", "Looking.", tool_calls=(read, search)),
        # Results arrive in completion order; the wire wants the calls' order.
        Message(
            "tool_results",
            results=(
                ToolResult("call_B", "pattern too broad", is_error=True),
                ToolResult("call_A", "# TODO: validate input"),
            ),
        ),
        Message("assistant", tool_calls=(ToolCall("call_C", "read_file", {"path": "b"}),)),
        Message("tool_results", "2 turns left", results=(ToolResult("call_C", "b's text"),)),
    ]
    gpt(model_server, max_tokens=512, extra_body={"temperature": 0}).respond(
        conversation, [READ, SEARCH], system="You are terse."
    )
    request = model_server.last
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.body == {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "find the TODOs"},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {
                        "id": "call_A",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "src/app.py"}'},
                    },
                    {
                        "id": "call_B",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"pattern": "TODO"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_A", "content": "# TODO: validate input"},
            {"role": "tool", "tool_call_id": "call_B", "content": "ERROR: pattern too broad"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_C",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "b"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_C", "content": "b's text"},
            {"role": "user", "content": "2 turns left"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read_file",
                    "description": "Read a UTF-8 file of the workspace.",
                    "parameters": READ.parameters,
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "search",
                    "description": "Search files for a pattern.",
                    "parameters": SEARCH.parameters,
                },
            },
        ],
        "max_tokens": 512,
        "temperature": 0,
    }


def test_the_key_goes_as_a_bearer_token(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="openai_answer")
    ask(gpt(model_server))
    headers = model_server.last.headers
    assert headers["authorization"] == f"Bearer {KEY}"
    assert headers["content-type"] == "application/json"


def test_the_key_defaults_to_the_environment(
    model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    model_server.reply(fixture_name="openai_answer")
    ask(OpenAIChatModel("gpt-4o", base_url=f"{model_server.url}/v1"))
    assert model_server.last.headers["authorization"] == "Bearer sk-from-env"


def test_an_empty_key_sends_no_authorization(
    model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local servers (vLLM, llama.cpp, Ollama) need no key."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model_server.reply(fixture_name="openai_answer")
    model = OpenAIChatModel("qwen2.5:7b", base_url=f"{model_server.url}/v1/")
    ask(model)
    assert "authorization" not in model_server.last.headers
    assert model_server.last.path == "/v1/chat/completions"  # trailing slash tolerated
    assert KEY not in repr(model)


# ---------------------------------------------------------------- errors


def test_429_is_rate_limited_with_retry_after(model_server: ModelServer) -> None:
    model_server.reply(429, fixture_name="openai_error_429", headers={"retry-after": "2"})
    with pytest.raises(ModelRateLimited) as info:
        ask(gpt(model_server))
    assert info.value.retry_after == 2.0
    assert len(model_server.requests) == 1  # no retry here: the caller decides
    assert info.value.model == "gpt-4o"
    assert "Rate limit reached for gpt-4o" in str(info.value)
    assert_secret_hidden(info.value, KEY)


def test_429_retry_after_may_be_an_http_date_or_absent(model_server: ModelServer) -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    model_server.reply(429, fixture_name="openai_error_429", headers={"retry-after": when})
    model_server.reply(429, fixture_name="openai_error_429")
    with pytest.raises(ModelRateLimited) as dated:
        ask(gpt(model_server))
    with pytest.raises(ModelRateLimited) as bare:
        ask(gpt(model_server))
    assert dated.value.retry_after == pytest.approx(30, abs=2)
    assert bare.value.retry_after is None


def test_500_is_unavailable(model_server: ModelServer) -> None:
    model_server.reply(500, fixture_name="openai_error_500")
    with pytest.raises(ModelUnavailable) as info:
        ask(gpt(model_server))
    assert info.value.status == 500
    assert "The server had an error" in str(info.value)
    assert_secret_hidden(info.value, KEY)


def test_400_is_rejected_with_the_providers_message(model_server: ModelServer) -> None:
    model_server.reply(400, fixture_name="openai_error_400")
    with pytest.raises(ModelRequestRejected) as info:
        ask(gpt(model_server))
    assert info.value.status == 400
    assert info.value.error_type == "invalid_request_error"
    assert info.value.provider_message.startswith("An assistant message with 'tool_calls'")
    assert "must be followed by tool messages" in str(info.value)
    assert_secret_hidden(info.value, KEY)


def test_a_key_a_server_echoes_back_is_redacted(model_server: ModelServer) -> None:
    model_server.reply(401, body={"error": {"message": f"Incorrect API key provided: {KEY}."}})
    with pytest.raises(ModelRequestRejected) as info:
        ask(gpt(model_server))
    assert "Incorrect API key provided: [redacted]." in str(info.value)
    assert_secret_hidden(info.value, KEY)


def test_a_closed_port_is_unavailable(closed_port: int) -> None:
    model = OpenAIChatModel("gpt-4o", base_url=f"http://127.0.0.1:{closed_port}/v1", api_key=KEY)
    with pytest.raises(ModelUnavailable) as info:
        ask(model)
    assert info.value.status is None
    assert f"cannot reach http://127.0.0.1:{closed_port}/v1/chat/completions" in str(info.value)
    assert "refused" in str(info.value).lower()
    assert_secret_hidden(info.value, KEY)


def test_a_slow_server_times_out_as_unavailable(model_server: ModelServer) -> None:
    model_server.reply(hang=True, fixture_name="openai_answer")
    started = time.monotonic()
    with pytest.raises(ModelUnavailable) as info:
        ask(gpt(model_server, timeout=0.3))
    assert time.monotonic() - started < 5
    assert "within 0.3s" in str(info.value)
    assert_secret_hidden(info.value, KEY)


def test_a_body_that_is_not_json_is_a_bad_response(model_server: ModelServer) -> None:
    model_server.reply(raw=b"<html>502 Bad Gateway</html>")
    with pytest.raises(ModelBadResponse, match="not JSON") as info:
        ask(gpt(model_server))
    assert "502 Bad Gateway" in str(info.value)
    assert_secret_hidden(info.value, KEY)


def test_arguments_that_are_not_json_name_the_call(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="openai_bad_arguments")
    with pytest.raises(ModelBadResponse) as info:
        ask(gpt(model_server))
    assert "call_Tr4uncAted9ArgsJs0nQ1w2e" in str(info.value)
    assert "arguments are not valid JSON" in str(info.value)


def test_arguments_must_be_a_json_object(model_server: ModelServer) -> None:
    doc = fixture("openai_bad_arguments")
    doc["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '["src/app.py"]'
    model_server.reply(body=doc)
    with pytest.raises(ModelBadResponse, match="not a JSON object: list"):
        ask(gpt(model_server))


def test_an_unknown_tool_call_type_is_a_bad_response(model_server: ModelServer) -> None:
    model_server.reply(fixture_name="openai_unknown_call_type")
    with pytest.raises(ModelBadResponse, match=r"tool_calls\[0\] has unknown type 'custom'"):
        ask(gpt(model_server))


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ({"object": "chat.completion"}, "response.choices is not a list: missing"),
        ({"choices": []}, "response.choices is empty"),
        ({"choices": [{"message": "hi"}]}, "choices[0].message is not an object: str"),
        ([1, 2], "JSON but not an object: list"),
    ],
)
def test_a_body_without_the_expected_fields_says_what_is_wrong(
    model_server: ModelServer, body: object, what: str
) -> None:
    model_server.reply(body=body)
    with pytest.raises(ModelBadResponse) as info:
        ask(gpt(model_server))
    assert what in str(info.value)
