"""The Anthropic provider against a fake Messages API on a real socket."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.providers.conftest import ANTHROPIC_KEY, ANTHROPIC_KEY_ENV
from tests.integration.providers.fakes import PREFILL_MESSAGE, FakeAnthropic, error
from tests.integration.providers.helpers import (
    CONNECTION_RESET,
    MakeModel,
    drain,
    failure,
    finish_of,
    request,
    text_of,
    user,
)

KEYED = {"apiKeyEnv": ANTHROPIC_KEY_ENV}
PNG = {"type": "file", "mediaType": "image/png", "data": "iVBORw0KGgo="}


@pytest.fixture(autouse=True)
def fresh(anthropic_api: FakeAnthropic) -> Iterator[None]:
    anthropic_api.reset()
    return


def history(call_id: str) -> list[dict[str, Any]]:
    """A finished tool call, its result, then a new question (tool ids as the caller stored them)."""
    return [
        user("weather?"),
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool-call",
                    "toolCallId": call_id,
                    "toolName": "weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "tool",
            "content": [
                {"type": "tool-result", "toolCallId": call_id, "toolName": "weather", "output": {"c": 21}}
            ],
        },
        user("and tomorrow?"),
    ]


@pytest.mark.parametrize("streaming", [True, False])
async def test_text_usage_and_request_shape(
    anthropic_api: FakeAnthropic, make_model: MakeModel, streaming: bool
) -> None:
    anthropic_api.script("claude-x", {"text": "Hello there world", "usage": [25, 4]})
    model = make_model(anthropic_api, "claude-x", kind="anthropic", name="anthropic", **KEYED)
    prompt = [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Be kind."},
        user("hi"),
    ]
    chunks = await drain(model, request(*prompt, streaming=streaming))

    assert model.model_id == "anthropic/claude-x"
    assert text_of(chunks) == "Hello there world"
    assert len([c for c in chunks if c["type"] == "text-delta"]) == (3 if streaming else 1)
    assert finish_of(chunks) == {
        "finishReason": "stop",
        "usage": {"inputTokens": 25, "outputTokens": 4, "totalTokens": 29},
    }
    [call] = anthropic_api.calls("claude-x")
    assert call.path == "/v1/messages"
    assert (call.headers["x-api-key"], call.headers["anthropic-version"]) == (ANTHROPIC_KEY, "2023-06-01")
    assert call.body["system"] == "Be brief.\n\nBe kind."
    assert call.body["max_tokens"] == 4096
    assert call.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert call.body.get("stream", False) is streaming


@pytest.mark.parametrize("streaming", [True, False])
async def test_tool_use_blocks_become_tool_calls(
    anthropic_api: FakeAnthropic, make_model: MakeModel, streaming: bool
) -> None:
    calls = [
        {"id": "toolu_1", "name": "weather", "args": {"city": "Paris", "days": [1, 2]}},
        {"id": "toolu_2", "name": "time", "args": {}},
    ]
    anthropic_api.script("claude-x", {"text": "Checking.", "toolCalls": calls})
    model = make_model(anthropic_api, "claude-x", kind="anthropic", maxTokens=512, **KEYED)
    tools = [
        {"name": "weather", "description": "Weather.", "inputSchema": {"type": "object"}},
        {"name": "time"},
    ]
    chunks = await drain(model, request(streaming=streaming, tools=tools, tool_choice="required"))

    assert [c["payload"] for c in chunks if c["type"] == "tool-call"] == [
        {"toolCallId": "toolu_1", "toolName": "weather", "args": {"city": "Paris", "days": [1, 2]}},
        {"toolCallId": "toolu_2", "toolName": "time", "args": {}},
    ]
    assert finish_of(chunks)["finishReason"] == "tool-calls"
    body = anthropic_api.calls("claude-x")[0].body
    assert body["max_tokens"] == 512
    assert body["tools"] == [
        {"name": "weather", "description": "Weather.", "input_schema": {"type": "object"}},
        {"name": "time", "description": "", "input_schema": {"type": "object", "properties": {}}},
    ]
    assert body["tool_choice"] == {"type": "any"}


async def test_history_is_merged_into_alternating_turns(
    anthropic_api: FakeAnthropic, make_model: MakeModel
) -> None:
    model = make_model(anthropic_api, "claude-x", kind="anthropic", **KEYED)
    await drain(
        model,
        request(
            *history("toolu_1"),
            tools=[{"name": "weather"}],
            tool_choice={"type": "tool", "toolName": "weather"},
        ),
    )

    body = anthropic_api.calls("claude-x")[0].body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"c": 21}'},
                {"type": "text", "text": "and tomorrow?"},
            ],
        },
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "weather"}


async def test_files_become_image_and_document_blocks(
    anthropic_api: FakeAnthropic, make_model: MakeModel
) -> None:
    model = make_model(anthropic_api, "claude-x", kind="anthropic", **KEYED)
    files = [
        PNG,
        {"type": "file", "mediaType": "application/pdf", "data": "data:application/pdf;base64,JVBERi0="},
        {"type": "file", "mediaType": "image/jpeg", "data": "https://example.com/cat.jpg"},
        {"type": "file", "mediaType": "text/plain", "data": b"plain words"},
    ]
    await drain(model, request({"role": "user", "content": files}))
    assert anthropic_api.calls("claude-x")[0].body["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain words"}},
    ]


@pytest.mark.parametrize(
    ("native", "mapped"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool-calls"),
        ("max_tokens", "length"),
        ("refusal", "content-filter"),
        ("pause_turn", "other"),
    ],
)
async def test_stop_reasons(
    anthropic_api: FakeAnthropic, make_model: MakeModel, native: str, mapped: str
) -> None:
    anthropic_api.script("claude-x", {"text": "x", "finish": native})
    chunks = await drain(make_model(anthropic_api, "claude-x", kind="anthropic", **KEYED), request())
    assert finish_of(chunks)["finishReason"] == mapped


async def test_prefill_rejection(anthropic_api: FakeAnthropic, make_model: MakeModel) -> None:
    prompt = [user("hi"), {"role": "assistant", "content": [{"type": "text", "text": "Sure,"}]}]
    _, err = await failure(make_model(anthropic_api, "claude-x", kind="anthropic", **KEYED), request(*prompt))
    assert (err.status, err.retryable, err.error_id, err.message) == (
        400,
        False,
        "invalid_request_error",
        PREFILL_MESSAGE,
    )
    assert json.loads(err.body) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": PREFILL_MESSAGE},
    }


async def test_tool_use_id_pattern_rejection(anthropic_api: FakeAnthropic, make_model: MakeModel) -> None:
    _, err = await failure(
        make_model(anthropic_api, "house", kind="anthropic", **KEYED), request(*history("call:1/a"))
    )
    assert (err.status, err.retryable) == (400, False)
    assert err.message == "messages.1.content.1.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize(
    ("reply", "status", "retryable", "needle"),
    [
        pytest.param(
            error(422, "messages.0.content: Input should be a valid list"), 422, False, "valid list", id="422"
        ),
        pytest.param(
            error(400, "prompt is too long: 210000 tokens > 200000 maximum"),
            400,
            False,
            "prompt is too long",
            id="context",
        ),
        pytest.param(
            error(500, "Internal server error", "api_error"), 500, True, "Internal server error", id="500"
        ),
        pytest.param(error(529, "Overloaded", "overloaded_error"), 529, True, "Overloaded", id="529"),
        # overloaded_error is retryable whatever status a gateway puts on it
        pytest.param(
            error(400, "Overloaded", "overloaded_error"), 400, True, "Overloaded", id="overloaded-400"
        ),
    ],
)
async def test_http_errors_are_mapped(
    anthropic_api: FakeAnthropic,
    make_model: MakeModel,
    streaming: bool,
    reply: dict[str, Any],
    status: int,
    retryable: bool,
    needle: str,
) -> None:
    anthropic_api.script("claude-x", {**reply, "headers": {"request-id": "req_42"}})
    model = make_model(anthropic_api, "claude-x", kind="anthropic", **KEYED)
    _, err = await failure(model, request(streaming=streaming))
    assert (err.status, err.retryable, err.error_id) == (status, retryable, reply["error"]["type"])
    assert needle in err.message
    assert needle in err.body
    assert err.details == {"requestId": "req_42"}


async def test_429_carries_retry_after(anthropic_api: FakeAnthropic, make_model: MakeModel) -> None:
    anthropic_api.script(
        "claude-x",
        {
            **error(429, "Number of requests has exceeded your rate limit", "rate_limit_error"),
            "headers": {"retry-after": "7"},
        },
    )
    _, err = await failure(make_model(anthropic_api, "claude-x", kind="anthropic", **KEYED), request())
    assert (err.status, err.retryable, err.error_id, err.details) == (
        429,
        True,
        "rate_limit_error",
        {"retryAfterMs": 7000.0},
    )


async def test_unsupported_image_rejection(anthropic_api: FakeAnthropic, make_model: MakeModel) -> None:
    anthropic_api.text_only.add("claude-x")
    model = make_model(anthropic_api, "claude-x", kind="anthropic", **KEYED)
    _, err = await failure(
        model, request({"role": "user", "content": [{"type": "text", "text": "look"}, PNG]})
    )
    assert (err.status, err.retryable) == (400, False)
    assert "does not support images" in err.message


async def test_overloaded_error_event_mid_stream(anthropic_api: FakeAnthropic, make_model: MakeModel) -> None:
    anthropic_api.script(
        "claude-x", {"text": "a b", "streamError": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    _, err = await failure(make_model(anthropic_api, "claude-x", kind="anthropic", **KEYED), request())
    assert (err.status, err.retryable, err.error_id, err.message) == (
        529,
        True,
        "overloaded_error",
        "Overloaded",
    )


async def test_connection_reset_mid_stream(anthropic_api: FakeAnthropic, make_model: MakeModel) -> None:
    anthropic_api.script("claude-x", {"text": "one two three four", "resetAfter": 5})
    chunks, err = await failure(make_model(anthropic_api, "claude-x", kind="anthropic", **KEYED), request())
    assert text_of(chunks) == "one two"  # message_start, ping, block start, two deltas
    assert (err.status, err.retryable) == (0, True)
    assert CONNECTION_RESET.search(err.message), err.message


async def test_wrong_key_is_401(
    anthropic_api: FakeAnthropic, make_model: MakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ANTHROPIC_KEY_ENV, "wrong")
    _, err = await failure(make_model(anthropic_api, "claude-x", kind="anthropic", **KEYED), request())
    assert (err.status, err.retryable, err.error_id) == (401, False, "authentication_error")
