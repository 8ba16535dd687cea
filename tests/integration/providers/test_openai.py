"""The OpenAI-compatible provider against a fake chat-completions server on a real socket."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from procmesh_orchestrator.config import ProviderConfig
from procmesh_orchestrator.providers import OpenAIModel, ProviderConnection
from tests.integration.providers.conftest import OPENAI_KEY, OPENAI_KEY_ENV
from tests.integration.providers.fakes import FakeOpenAI, error
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

KEYED = {"apiKeyEnv": OPENAI_KEY_ENV}
PNG = {"type": "file", "mediaType": "image/png", "data": "iVBORw0KGgo="}


@pytest.fixture(autouse=True)
def fresh(openai_api: FakeOpenAI) -> Iterator[None]:
    openai_api.reset()
    return


@pytest.mark.parametrize("streaming", [True, False])
async def test_text_usage_and_request_shape(
    openai_api: FakeOpenAI, make_model: MakeModel, streaming: bool
) -> None:
    openai_api.script("m", {"text": "Hello there world", "usage": [12, 3]})
    model = make_model(openai_api, "m", kind="openai", name="local", **KEYED)
    chunks = await drain(
        model, request({"role": "system", "content": "Be brief."}, user("hi"), streaming=streaming)
    )

    assert model.model_id == "local/m"
    assert text_of(chunks) == "Hello there world"
    deltas = [c for c in chunks if c["type"] == "text-delta"]
    assert len(deltas) == (3 if streaming else 1)
    assert finish_of(chunks) == {
        "finishReason": "stop",
        "usage": {"inputTokens": 12, "outputTokens": 3, "totalTokens": 15},
    }
    [call] = openai_api.calls("m")
    assert call.path == "/v1/chat/completions"
    assert call.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert call.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    if streaming:
        assert call.body["stream"] is True
        assert call.body["stream_options"] == {"include_usage": True}
    else:
        assert "stream" not in call.body


@pytest.mark.parametrize("streaming", [True, False])
async def test_tool_calls_are_accumulated_and_parsed(
    openai_api: FakeOpenAI, make_model: MakeModel, streaming: bool
) -> None:
    calls = [
        {"id": "call_a", "name": "weather", "args": {"city": "Paris", "days": 2}},
        {"id": "call_b", "name": "time", "args": {}},
    ]
    openai_api.script("m", {"text": "Checking.", "toolCalls": calls})
    model = make_model(openai_api, "m", kind="openai", **KEYED)
    tools = [
        {"name": "weather", "description": "Weather.", "inputSchema": {"type": "object"}},
        {"name": "time", "description": "", "inputSchema": {}},
    ]
    chunks = await drain(
        model, request(streaming=streaming, tools=tools, tool_choice={"type": "tool", "toolName": "weather"})
    )

    assert [c["payload"] for c in chunks if c["type"] == "tool-call"] == [
        {"toolCallId": "call_a", "toolName": "weather", "args": {"city": "Paris", "days": 2}},
        {"toolCallId": "call_b", "toolName": "time", "args": {}},
    ]
    assert finish_of(chunks)["finishReason"] == "tool-calls"
    body = openai_api.calls("m")[0].body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "description": "Weather.", "parameters": {"type": "object"}},
        },
        {
            "type": "function",
            "function": {
                "name": "time",
                "description": "",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}


async def test_history_with_tool_results_and_an_image(openai_api: FakeOpenAI, make_model: MakeModel) -> None:
    model = make_model(openai_api, "m", kind="openai", **KEYED)
    prompt = [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, PNG]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool-call", "toolCallId": "c1", "toolName": "lookup", "input": {"q": "png"}},
                {"type": "tool-call", "toolCallId": "c2", "toolName": "lookup", "input": {"q": "gif"}},
            ],
        },
        {
            "role": "tool",
            "content": [
                {
                    "type": "tool-result",
                    "toolCallId": "c1",
                    "toolName": "lookup",
                    "output": {"kind": "image"},
                },
                {"type": "tool-result", "toolCallId": "c2", "toolName": "lookup", "output": "nothing"},
            ],
        },
    ]
    await drain(model, request(*prompt, tools=[{"name": "lookup"}], tool_choice="required"))

    body = openai_api.calls("m")[0].body
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "png"}'}},
                {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "gif"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"kind": "image"}'},
        {"role": "tool", "tool_call_id": "c2", "content": "nothing"},
    ]
    assert body["tool_choice"] == "required"


@pytest.mark.parametrize(
    ("native", "mapped"),
    [("stop", "stop"), ("length", "length"), ("content_filter", "content-filter"), ("weird", "other")],
)
async def test_finish_reasons(
    openai_api: FakeOpenAI, make_model: MakeModel, native: str, mapped: str
) -> None:
    openai_api.script("m", {"text": "x", "finish": native})
    chunks = await drain(make_model(openai_api, "m", kind="openai", **KEYED), request())
    assert finish_of(chunks)["finishReason"] == mapped


CONTEXT = error(
    400,
    "This model's maximum context length is 8192 tokens. However, your messages resulted in 9001 tokens.",
    code="context_length_exceeded",
)
FASTAPI_422 = {
    "status": 422,
    "raw": {"detail": [{"loc": ["body", "messages"], "msg": "Field required", "type": "missing"}]},
}


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize(
    ("reply", "status", "retryable", "message", "error_id"),
    [
        pytest.param(
            CONTEXT, 400, False, "maximum context length is 8192", "context_length_exceeded", id="context"
        ),
        pytest.param(FASTAPI_422, 422, False, '"msg":"Field required"', "", id="422"),
        pytest.param(
            error(500, "The server had an error", "server_error"),
            500,
            True,
            "server had an error",
            "server_error",
            id="500",
        ),
        pytest.param(
            error(503, "overloaded", "server_error"), 503, True, "overloaded", "server_error", id="503"
        ),
        pytest.param(
            {"status": 502, "raw": "<html>Bad gateway</html>"},
            502,
            True,
            "<html>Bad gateway</html>",
            "",
            id="html",
        ),
        pytest.param(
            {"status": 409, "raw": {"error": "model is loading"}},
            409,
            True,
            "model is loading",
            "",
            id="ollama",
        ),
    ],
)
async def test_http_errors_are_mapped(
    openai_api: FakeOpenAI,
    make_model: MakeModel,
    streaming: bool,
    reply: dict[str, object],
    status: int,
    retryable: bool,
    message: str,
    error_id: str,
) -> None:
    openai_api.script("m", reply)
    _, err = await failure(make_model(openai_api, "m", kind="openai", **KEYED), request(streaming=streaming))
    assert (err.status, err.retryable, err.error_id) == (status, retryable, error_id)
    assert message in err.message
    sent = reply["raw"] if "raw" in reply else openai_api.error_body(reply["error"])  # type: ignore[arg-type]
    assert err.body == (sent if isinstance(sent, str) else json.dumps(sent))


async def test_429_carries_retry_after(openai_api: FakeOpenAI, make_model: MakeModel) -> None:
    openai_api.script(
        "m",
        {
            **error(429, "Rate limit reached", "requests", "rate_limit_exceeded"),
            "headers": {"Retry-After": "2"},
        },
    )
    _, err = await failure(make_model(openai_api, "m", kind="openai", **KEYED), request())
    assert (err.status, err.retryable, err.details["retryAfterMs"]) == (429, True, 2000.0)


async def test_wrong_key_is_401(
    openai_api: FakeOpenAI, make_model: MakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OPENAI_KEY_ENV, "sk-wrong")
    _, err = await failure(make_model(openai_api, "m", kind="openai", **KEYED), request())
    assert (err.status, err.retryable, err.error_id) == (401, False, "invalid_api_key")


async def test_missing_key_fails_clearly_before_any_request(
    openai_api: FakeOpenAI, make_model: MakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(OPENAI_KEY_ENV)
    _, err = await failure(make_model(openai_api, "m", kind="openai", name="local", **KEYED), request())
    assert err.message.startswith(
        f"providers.local.apiKeyEnv: environment variable {OPENAI_KEY_ENV} is not set"
    )
    assert (err.error_id, err.retryable) == ("API_KEY_MISSING", False)
    assert openai_api.calls("m") == []


async def test_no_key_configured_sends_no_authorization(make_model: MakeModel) -> None:
    api = FakeOpenAI().start()  # a local server that needs no key
    try:
        chunks = await drain(make_model(api, "m", kind="openai"), request())
        assert text_of(chunks) == "ok"
        assert "authorization" not in api.calls("m")[0].headers
    finally:
        api.stop()


async def test_unsupported_image_rejection(openai_api: FakeOpenAI, make_model: MakeModel) -> None:
    openai_api.text_only.add("m")
    _, err = await failure(
        make_model(openai_api, "m", kind="openai", **KEYED), request({"role": "user", "content": [PNG]})
    )
    assert (err.status, err.retryable) == (400, False)
    assert "does not support image input" in err.message


@pytest.mark.parametrize("streaming", [True, False])
async def test_connection_reset_mid_stream(
    openai_api: FakeOpenAI, make_model: MakeModel, streaming: bool
) -> None:
    openai_api.script("m", {"text": "one two three four", "resetAfter": 3})
    chunks, err = await failure(
        make_model(openai_api, "m", kind="openai", **KEYED), request(streaming=streaming)
    )
    if streaming:
        assert text_of(chunks) == "one two"  # the role delta and two words arrived first
    assert (err.status, err.retryable) == (0, True)
    assert CONNECTION_RESET.search(err.message), err.message


async def test_sse_error_payload_mid_stream(openai_api: FakeOpenAI, make_model: MakeModel) -> None:
    openai_api.script(
        "m",
        {
            "text": "one two three",
            "streamError": {"type": "server_error", "message": "engine died", "code": None},
        },
    )
    chunks, err = await failure(make_model(openai_api, "m", kind="openai", **KEYED), request())
    assert text_of(chunks) == "one two"
    assert (err.status, err.retryable, err.message) == (500, True, "engine died")


async def test_connection_refused_is_retryable_status_0(make_model: MakeModel) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = ProviderConfig(kind="openai", base_url=f"http://127.0.0.1:{port}/v1")
    connection = ProviderConnection("down", cfg)
    try:
        _, err = await failure(OpenAIModel(connection, "m"), request())
    finally:
        await connection.aclose()
    assert (err.status, err.retryable) == (0, True)
    assert CONNECTION_RESET.search(err.message), err.message


async def test_provider_retries_before_the_first_chunk(openai_api: FakeOpenAI, make_model: MakeModel) -> None:
    openai_api.script(
        "m",
        error(500, "boom", "server_error"),
        error(429, "slow down", "rate_limit_exceeded"),
        {"text": "fine"},
    )
    model = make_model(openai_api, "m", kind="openai", maxRetries=2, retryBackoffMs=1, **KEYED)
    assert text_of(await drain(model, request())) == "fine"
    assert len(openai_api.calls("m")) == 3


async def test_provider_retries_stop_at_max_and_skip_rejections(
    openai_api: FakeOpenAI, make_model: MakeModel
) -> None:
    openai_api.script("down", error(500, "boom", "server_error"))
    openai_api.script("bad", error(400, "bad request"))
    openai_api.script("cut", {"text": "a b c d", "resetAfter": 2})
    for name, expected_calls in (("down", 3), ("bad", 1), ("cut", 1)):
        model = make_model(openai_api, name, kind="openai", maxRetries=2, retryBackoffMs=1, **KEYED)
        await failure(model, request())
        assert len(openai_api.calls(name)) == expected_calls, name


async def test_max_tokens_settings_and_provider_options(
    openai_api: FakeOpenAI, make_model: MakeModel
) -> None:
    model = make_model(openai_api, "m", kind="openai", maxTokens=256, **KEYED)
    await drain(
        model,
        request(
            model_settings={"temperature": 0.2, "stopSequences": ["END"], "seed": 7},
            provider_options={"openai": {"logprobs": True}, "anthropic": {"ignored": 1}},
        ),
    )
    body = openai_api.calls("m")[0].body
    assert {k: body[k] for k in ("max_tokens", "temperature", "stop", "seed", "logprobs")} == {
        "max_tokens": 256,
        "temperature": 0.2,
        "stop": ["END"],
        "seed": 7,
        "logprobs": True,
    }
    assert "ignored" not in json.dumps(body)
