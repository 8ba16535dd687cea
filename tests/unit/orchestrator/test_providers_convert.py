"""Prompt, tool-choice and file conversion of both wire formats (pure functions)."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_orchestrator.config import ProviderConfig
from procmesh_orchestrator.providers import AnthropicModel, OpenAIModel, ProviderConnection, anthropic, openai
from procmesh_orchestrator.providers._base import FileData, file_data
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.models import ModelRequest


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"type": "tool", "toolName": "weather"}, {"type": "function", "function": {"name": "weather"}}),
    ],
)
def test_openai_tool_choice(choice: Any, wire: Any) -> None:
    assert openai.convert_tool_choice(choice) == wire


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ({"type": "tool", "toolName": "weather"}, {"type": "tool", "name": "weather"}),
        (None, None),
    ],
)
def test_anthropic_tool_choice(choice: Any, wire: Any) -> None:
    assert anthropic.convert_tool_choice(choice) == wire


def test_openai_user_turns() -> None:
    assert openai.convert_prompt([user(text("one"))]) == [{"role": "user", "content": "one"}]
    assert openai.convert_prompt([user(text("a"), text("b"))]) == [
        {"role": "user", "content": [text("a"), text("b")]}
    ]
    files = [
        {"type": "file", "mediaType": "audio/wav", "data": "UklGRg=="},
        {"type": "file", "mediaType": "application/pdf", "data": b"%PDF", "filename": "a.pdf"},
        {"type": "file", "mediaType": "image/png", "data": "https://example.com/a.png"},
    ]
    assert openai.convert_prompt([user(*files)])[0]["content"] == [
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERg=="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    ]


def test_openai_assistant_without_text_has_null_content() -> None:
    prompt = [
        {
            "role": "assistant",
            "content": [{"type": "tool-call", "toolCallId": "c", "toolName": "t", "input": None}],
        }
    ]
    assert openai.convert_prompt(prompt) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "t", "arguments": "{}"}}],
        }
    ]


def test_anthropic_merges_same_role_turns_and_drops_empty_ones() -> None:
    prompt = [
        {"role": "system", "content": "S"},
        user(text("a")),
        user(text("")),  # nothing left to send
        {"role": "user", "content": [text("<system-reminder>b</system-reminder>")]},
        {"role": "assistant", "content": [{"type": "reasoning", "text": "hmm"}, text("c")]},
        {"role": "assistant", "content": [text("d")]},
    ]
    system, messages = anthropic.convert_prompt(prompt)
    assert system == "S"
    assert messages == [
        {"role": "user", "content": [text("a"), text("<system-reminder>b</system-reminder>")]},
        {"role": "assistant", "content": [text("c"), text("d")]},
    ]


def test_anthropic_tool_results_lead_the_next_user_turn() -> None:
    prompt = [
        user(text("q")),
        {
            "role": "assistant",
            "content": [{"type": "tool-call", "toolCallId": "t1", "toolName": "x", "input": {"a": 1}}],
        },
        {
            "role": "tool",
            "content": [{"type": "tool-result", "toolCallId": "t1", "toolName": "x", "output": 3}],
        },
        user(text("more")),
    ]
    _, messages = anthropic.convert_prompt(prompt)
    assert messages[1:] == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {"a": 1}}]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "3"}, text("more")],
        },
    ]


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        ({"mediaType": "image/png", "data": b"\x89PNG"}, FileData("image/png", base64="iVBORw==")),
        ({"mediaType": "image/png", "data": "iVBORw=="}, FileData("image/png", base64="iVBORw==")),
        ({"mediaType": "", "data": "data:image/gif;base64,R0lG"}, FileData("image/gif", base64="R0lG")),
        ({"mediaType": "text/plain", "data": "data:text/plain,hi"}, FileData("text/plain", base64="aGk=")),
        (
            {"mediaType": "image/png", "data": "https://x.test/a.png"},
            FileData("image/png", url="https://x.test/a.png"),
        ),
        ({"data": "AAAA"}, FileData("application/octet-stream", base64="AAAA")),
    ],
)
def test_file_data_forms(part: dict[str, Any], expected: FileData) -> None:
    assert file_data(part) == expected


def test_data_url() -> None:
    assert FileData("image/png", base64="AA==").data_url == "data:image/png;base64,AA=="
    assert FileData("image/png", url="https://x.test/a").data_url == "https://x.test/a"


# -- a call's options and image parts in the request bodies (issue 20) ---------------------------

PNG = "iVBORw0KGgo="
IMAGES = [  # the run's file parts, as the HTTP API builds them from image parts
    {"type": "file", "mediaType": "image/png", "data": PNG},
    {"type": "file", "mediaType": "image/*", "data": "https://x.test/a.jpg"},
]


def _request(**kw: Any) -> ModelRequest:
    message = {"role": "user", "content": {"format": 2, "parts": [text("what is it?"), *IMAGES]}}
    prompt = msgs.build_prompt([], [message])
    tools = [{"name": "weather", "description": "W", "inputSchema": {"type": "object"}}]
    return ModelRequest(prompt=prompt, tools=tools, **kw)


def _body(kind: str, request: ModelRequest) -> dict[str, Any]:
    connection = ProviderConnection("p", ProviderConfig(kind=kind, base_url="http://api.test/v1"))
    model = OpenAIModel(connection, "m") if kind == "openai" else AnthropicModel(connection, "m")
    return model.body(request)


def test_openai_body_sends_images_settings_choice_and_response_format() -> None:
    schema = {"type": "object"}
    body = _body(
        "openai",
        _request(
            model_settings={"temperature": 0.2, "maxOutputTokens": 64, "topP": 0.9},
            tool_choice={"type": "tool", "toolName": "weather"},
            response_format={"type": "json", "schema": schema, "name": "response"},
        ),
    )
    assert body["messages"][0]["content"] == [
        text("what is it?"),
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
    ]
    assert (body["temperature"], body["max_tokens"], body["top_p"]) == (0.2, 64, 0.9)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": schema},
    }


def test_anthropic_body_sends_image_blocks_settings_and_choice() -> None:
    body = _body(
        "anthropic", _request(model_settings={"temperature": 0.2, "topK": 5}, tool_choice="required")
    )
    assert body["messages"][0]["content"] == [
        text("what is it?"),
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
    ]
    assert (body["temperature"], body["top_k"]) == (0.2, 5)
    assert body["tool_choice"] == {"type": "any"}
    assert "response_format" not in body  # no JSON mode: the structured output's instruction asks


def test_stored_provenance_reaches_the_prompt_and_anthropic_takes_back_only_its_signed_thinking() -> None:
    signed = {"type": "reasoning", "text": "mine", "providerMetadata": {"anthropic": {"signature": "sig-1"}}}
    detailed = {"type": "reasoning", "text": "theirs", "details": [{"type": "text", "signature": "enc"}]}
    search = {
        "type": "tool-invocation",
        "providerExecuted": True,
        "providerMetadata": {"anthropic": {}},
        "toolInvocation": {
            "state": "result",
            "toolCallId": "srv_1",
            "toolName": "web_search",
            "args": {},
            "result": "r",
        },
    }
    history = [
        {"id": "u", "role": "user", "content": {"format": 2, "parts": [text("q")]}},
        {
            "id": "a",
            "role": "assistant",
            "content": {"format": 2, "parts": [signed, detailed, search, text("a")]},
        },
    ]
    prompt = msgs.build_prompt([], history)
    assert prompt[1]["content"][:3] == [
        {"type": "reasoning", "text": "mine", "provider": "anthropic", "signature": "sig-1"},
        {"type": "reasoning", "text": "theirs", "signature": "enc"},
        {
            "type": "tool-call",
            "toolCallId": "srv_1",
            "toolName": "web_search",
            "input": {},
            "provider": "anthropic",
            "providerExecuted": True,
        },
    ]
    _, messages = anthropic.convert_prompt(prompt)
    # the provider's own signed thinking goes back; the unsigned-by-Anthropic one and the server
    # tool's call and result do not
    assert messages[1:] == [
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "mine", "signature": "sig-1"}, text("a")],
        }
    ]
    assert openai.convert_prompt(prompt)[1:] == [{"role": "assistant", "content": "a"}]
