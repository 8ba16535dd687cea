"""OpenAI-compatible chat completions (OpenAI, vLLM, Ollama, llama.cpp): ``{baseUrl}/chat/completions``."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from procmesh_orchestrator.providers._base import (
    COMMON_SETTINGS,
    HTTPModel,
    file_data,
    parse_tool_args,
    provider_executed,
    stream_cut,
    tool_output_text,
    tool_parameters,
    url_source,
    usage,
)
from procmesh_orchestrator.providers._http import error_from_payload, parse_json, post_json, post_sse
from procmesh_orchestrator.run.models import Chunk, ModelRequest
from procmesh_orchestrator.run.text_pieces import Pieces

FINISH_REASONS = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "length",
    "content_filter": "content-filter",
}
_SETTINGS = {
    **COMMON_SETTINGS,
    "maxOutputTokens": "max_tokens",
    "stopSequences": "stop",
    "presencePenalty": "presence_penalty",
    "frequencyPenalty": "frequency_penalty",
    "seed": "seed",
}
_AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}


def convert_prompt(prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The provider-shaped prompt as chat-completions messages.

    A user turn of one text part becomes a plain string (what every server
    accepts); files become ``image_url``, ``input_audio`` or ``file`` parts.
    Tool results become one ``role: tool`` message each. Reasoning is not sent (chat completions
    take none back), nor are tool calls a provider executed itself.
    """
    out: list[dict[str, Any]] = []
    executed = provider_executed(prompt)
    for msg in prompt:
        role, content = msg["role"], msg["content"]
        if role == "system":
            out.append({"role": "system", "content": content})
        elif role == "user":
            parts = [_user_part(p) for p in content]
            if len(parts) == 1 and parts[0]["type"] == "text":
                out.append({"role": "user", "content": parts[0]["text"]})
            else:
                out.append({"role": "user", "content": parts})
        elif role == "assistant":
            text = "".join(p["text"] for p in content if p["type"] == "text")
            calls = [
                {
                    "id": p["toolCallId"],
                    "type": "function",
                    "function": {
                        "name": p["toolName"],
                        "arguments": json.dumps(p.get("input") or {}, ensure_ascii=False),
                    },
                }
                for p in content
                if p["type"] == "tool-call" and p["toolCallId"] not in executed
            ]
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
        elif role == "tool":
            out.extend(
                {
                    "role": "tool",
                    "tool_call_id": p["toolCallId"],
                    "content": tool_output_text(p.get("output")),
                }
                for p in content
                if p["type"] == "tool-result" and p["toolCallId"] not in executed
            )
    return out


def _user_part(part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "text":
        return {"type": "text", "text": part.get("text", "")}
    data = file_data(part)
    if data.media_type.startswith("image/"):
        return {"type": "image_url", "image_url": {"url": data.data_url}}
    if data.media_type in _AUDIO_FORMATS and data.url is None:
        return {
            "type": "input_audio",
            "input_audio": {"data": data.base64, "format": _AUDIO_FORMATS[data.media_type]},
        }
    return {"type": "file", "file": {"filename": part.get("filename") or "file", "file_data": data.data_url}}


def convert_tool_choice(choice: Any) -> Any:
    """``auto``/``none``/``required`` as they are; ``{"type": "tool", "toolName"}`` as a function choice."""
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice.get("toolName", "")}}
    return choice


@dataclass
class _ToolCall:
    id: str = ""
    name: str = ""
    arguments: Pieces = field(default_factory=Pieces)
    """As streamed, in pieces."""


def _sources(message: dict[str, Any]) -> Iterator[Chunk]:
    """A web-search model's ``url_citation`` annotations as the reference's ``source`` chunks."""
    for note in message.get("annotations") or []:
        cited = note.get("url_citation") if isinstance(note, dict) else None
        if note.get("type") == "url_citation" and isinstance(cited, dict) and cited.get("url"):
            yield url_source(cited["url"], cited.get("title"))


@dataclass
class _StreamState:
    """Accumulates a chat-completions stream: tool calls by index, the finish reason, usage."""

    model_id: str
    calls: dict[int, _ToolCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)

    def feed(self, payload: dict[str, Any]) -> Iterator[Chunk]:
        if payload.get("usage"):
            self.usage = payload["usage"]
        for choice in payload.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):  # an OpenAI-compatible API's (DeepSeek, vLLM) reasoning
                yield {"type": "reasoning-delta", "payload": {"id": "r0", "text": delta["reasoning_content"]}}
            if delta.get("content"):
                yield {"type": "text-delta", "payload": {"id": "t0", "text": delta["content"]}}
            yield from _sources(delta)
            for raw in delta.get("tool_calls") or []:
                index = int(raw.get("index", len(self.calls)))
                call = self.calls.get(index) or self.calls.setdefault(index, _ToolCall())
                fn = raw.get("function") or {}
                call.id = call.id or raw.get("id") or ""
                call.name = call.name or fn.get("name") or ""
                call.arguments.add(_arguments(fn.get("arguments")))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def finish(self) -> Iterator[Chunk]:
        for index in sorted(self.calls):
            call = self.calls[index]
            yield {
                "type": "tool-call",
                "payload": {
                    "toolCallId": call.id or f"call_{uuid.uuid4().hex[:24]}",
                    "toolName": call.name,
                    "args": parse_tool_args(str(call.arguments), call.name, self.model_id),
                },
            }
        yield _finish(self.finish_reason, self.usage)


def _arguments(raw: Any) -> str:
    """Arguments as JSON text (some servers send an object instead of a string)."""
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else json.dumps(raw)


def _finish(reason: str | None, raw_usage: dict[str, Any]) -> Chunk:
    return {
        "type": "finish",
        "payload": {
            "finishReason": FINISH_REASONS.get(reason or "stop", "other"),
            "usage": usage(raw_usage.get("prompt_tokens"), raw_usage.get("completion_tokens")),
        },
    }


class OpenAIModel(HTTPModel):
    """A chat-completions model: streams with ``stream_options.include_usage``; bearer key."""

    settings: ClassVar[dict[str, str]] = _SETTINGS

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for `request` (without the stream flags)."""
        body: dict[str, Any] = {"model": self.model, "messages": convert_prompt(request.prompt)}
        if self.connection.config.max_tokens is not None:
            body["max_tokens"] = self.connection.config.max_tokens
        for key, wire in self.settings.items():
            if request.model_settings.get(key) is not None:
                body[wire] = request.model_settings[key]
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t.get("description") or "",
                        "parameters": tool_parameters(t),
                    },
                }
                for t in request.tools
            ]
            if request.tool_choice is not None:
                body["tool_choice"] = convert_tool_choice(request.tool_choice)
        if request.response_format is not None:
            schema = request.response_format["schema"]
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": request.response_format.get("name") or "response", "schema": schema},
            }
        body.update(request.provider_options.get(self.connection.config.kind) or {})
        return body

    def model_fetches(self, media_type: str) -> bool:
        """Chat completions fetch image URLs; files and audio must be sent inline."""
        return media_type.startswith("image/")

    def _headers(self) -> dict[str, str]:
        key = self.connection.api_key(self.model_id)
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[Chunk, None]:
        url = f"{self.connection.config.base_url}/chat/completions"
        headers = self._headers()
        body = self.body(request)
        client = self.connection.client
        if not request.streaming:
            answer = await post_json(client, url, headers=headers, body=body)
            for chunk in self._from_completion(answer):
                yield chunk
            return
        body.update(stream=True, stream_options={"include_usage": True})
        state = _StreamState(self.model_id)
        done = False
        async with contextlib.aclosing(post_sse(client, url, headers=headers, body=body)) as events:
            async for event in events:
                if event.data.strip() == "[DONE]":
                    done = True
                    break
                if not event.data.strip():
                    continue
                payload = parse_json(event.data, f"a stream event of {self.model_id}")
                if not isinstance(payload, dict):
                    continue
                if payload.get("error") is not None:
                    raise error_from_payload(payload, status=None, body=event.data)
                for chunk in state.feed(payload):
                    yield chunk
        if not done and state.finish_reason is None:
            raise stream_cut(self.model_id, "finish_reason or [DONE]")
        for chunk in state.finish():
            yield chunk

    def _from_completion(self, answer: Any) -> Iterator[Chunk]:
        if not isinstance(answer, dict):
            answer = {}
        if answer.get("error") is not None:
            raise error_from_payload(answer, status=None, body=json.dumps(answer))
        choice = (answer.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        if message.get("reasoning_content"):
            yield {"type": "reasoning-delta", "payload": {"id": "r0", "text": message["reasoning_content"]}}
        if message.get("content"):
            yield {"type": "text-delta", "payload": {"id": "t0", "text": message["content"]}}
        yield from _sources(message)
        state = _StreamState(self.model_id, finish_reason=choice.get("finish_reason"))
        state.usage = answer.get("usage") or {}
        for index, raw in enumerate(message.get("tool_calls") or []):
            fn = raw.get("function") or {}
            call = state.calls[index] = _ToolCall(raw.get("id") or "", fn.get("name") or "")
            call.arguments.add(_arguments(fn.get("arguments")))
        yield from state.finish()
