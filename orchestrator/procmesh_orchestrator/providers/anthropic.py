"""Anthropic Messages API: ``POST {baseUrl}/v1/messages`` with ``x-api-key`` and ``anthropic-version``."""

from __future__ import annotations

import contextlib
import json
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

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content-filter",
}
_SETTINGS = {
    **COMMON_SETTINGS,
    "maxOutputTokens": "max_tokens",
    "topK": "top_k",
    "stopSequences": "stop_sequences",
}


def convert_prompt(prompt: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The provider-shaped prompt as ``(system, messages)``.

    Tool results go into user turns as ``tool_result`` blocks; consecutive turns
    of the same role are merged (the API requires alternation); empty turns are
    dropped. Reasoning goes back as ``thinking`` only when Anthropic signed it (the API verifies the
    signature; `provider-history-compat` drops the rest); tool calls a provider executed itself
    are not sent.
    """
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    executed = provider_executed(prompt)
    for msg in prompt:
        role, content = msg["role"], msg["content"]
        if role == "system":
            if content:
                system.append(content)
            continue
        if role == "user":
            blocks = [_user_block(p) for p in content]
        elif role == "assistant":
            blocks = [
                _assistant_block(p)
                for p in content
                if p["type"] == "text"
                or (p["type"] == "tool-call" and p["toolCallId"] not in executed)
                or _own_thinking(p)
            ]
            role = "assistant"
        elif role == "tool":
            blocks = [
                {
                    "type": "tool_result",
                    "tool_use_id": p["toolCallId"],
                    "content": tool_output_text(p.get("output")),
                }
                for p in content
                if p["type"] == "tool-result" and p["toolCallId"] not in executed
            ]
            role = "user"
        else:
            continue
        blocks = [b for b in blocks if b.get("type") != "text" or b.get("text")]
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    return "\n\n".join(system), messages


def _user_block(part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "text":
        return {"type": "text", "text": part.get("text", "")}
    data = file_data(part)
    kind = "image" if data.media_type.startswith("image/") else "document"
    if data.url is not None:
        return {"type": kind, "source": {"type": "url", "url": data.url}}
    if data.media_type == "text/plain":
        return {"type": kind, "source": {"type": "text", "media_type": "text/plain", "data": data.text()}}
    return {"type": kind, "source": {"type": "base64", "media_type": data.media_type, "data": data.base64}}


def _own_thinking(part: dict[str, Any]) -> bool:
    return part["type"] == "reasoning" and bool(part.get("signature")) and part.get("provider") == "anthropic"


def _assistant_block(part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "text":
        return {"type": "text", "text": part.get("text", "")}
    if part["type"] == "reasoning":
        return {"type": "thinking", "thinking": part.get("text", ""), "signature": part["signature"]}
    tool_input = part.get("input")
    return {
        "type": "tool_use",
        "id": part["toolCallId"],
        "name": part["toolName"],
        "input": tool_input if isinstance(tool_input, dict) else {},
    }


def convert_tool_choice(choice: Any) -> dict[str, Any] | None:
    """``auto`` -> auto, ``required`` -> any, ``none`` -> none, ``{"type": "tool", "toolName"}`` -> tool."""
    if isinstance(choice, dict):
        return {"type": "tool", "name": choice.get("toolName", "")}
    return {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}.get(str(choice))


def _sources(citations: list[Any]) -> Iterator[Chunk]:
    """The web pages a text block cites (``web_search_result_location``) as ``source`` chunks."""
    for cited in citations:
        if isinstance(cited, dict) and cited.get("type") == "web_search_result_location" and cited.get("url"):
            yield url_source(cited["url"], cited.get("title"))


@dataclass
class _Block:
    type: str
    id: str = ""
    name: str = ""
    json: Pieces = field(default_factory=Pieces)
    """A tool call's arguments, as streamed (``input_json_delta``)."""
    signature: Pieces = field(default_factory=Pieces)


@dataclass
class _StreamState:
    """Accumulates a Messages stream: open content blocks, the stop reason, usage."""

    model_id: str
    blocks: dict[int, _Block] = field(default_factory=dict)
    stop_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    stopped: bool = False

    def feed(self, event: str, payload: dict[str, Any], raw: str) -> Iterator[Chunk]:
        kind = payload.get("type") or event
        if kind == "message_start":
            self._usage((payload.get("message") or {}).get("usage") or {})
        elif kind == "content_block_start":
            block = payload.get("content_block") or {}
            self.blocks[int(payload.get("index", 0))] = _Block(
                type=block.get("type", ""), id=block.get("id", ""), name=block.get("name", "")
            )
        elif kind == "content_block_delta":
            index = int(payload.get("index", 0))
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta" and delta.get("text"):
                yield {"type": "text-delta", "payload": {"id": f"t{index}", "text": delta["text"]}}
            elif delta.get("type") == "thinking_delta" and delta.get("thinking"):
                yield {"type": "reasoning-delta", "payload": {"id": f"r{index}", "text": delta["thinking"]}}
            elif delta.get("type") == "citations_delta":
                yield from _sources([delta.get("citation")])
            elif delta.get("type") == "signature_delta" and index in self.blocks:
                self.blocks[index].signature.add(delta.get("signature") or "")
            elif delta.get("type") == "input_json_delta" and index in self.blocks:
                self.blocks[index].json.add(delta.get("partial_json") or "")
        elif kind == "content_block_stop":
            done = self.blocks.pop(int(payload.get("index", 0)), None)
            if done is not None and done.type == "tool_use":
                args = parse_tool_args(str(done.json), done.name, self.model_id)
                yield _tool_call(done.id, done.name, args)
            elif done is not None and done.type == "thinking":  # its signature goes back with it
                signature = str(done.signature)
                signed = {"anthropic": {"signature": signature}} if signature else {}
                end = {"id": f"r{payload.get('index', 0)}", "providerMetadata": signed}
                yield {"type": "reasoning-end", "payload": end}
        elif kind == "message_delta":
            self.stop_reason = (payload.get("delta") or {}).get("stop_reason") or self.stop_reason
            self._usage(payload.get("usage") or {})
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            raise error_from_payload(payload, status=None, body=raw)

    def _usage(self, raw: dict[str, Any]) -> None:
        if raw.get("input_tokens") is not None:
            self.input_tokens = int(raw["input_tokens"])
        if raw.get("output_tokens") is not None:
            self.output_tokens = int(raw["output_tokens"])

    def finish(self) -> Chunk:
        return _finish(self.stop_reason, self.input_tokens, self.output_tokens)


def _tool_call(call_id: str, name: str, args: Any) -> Chunk:
    return {"type": "tool-call", "payload": {"toolCallId": call_id, "toolName": name, "args": args}}


def _finish(stop_reason: str | None, input_tokens: Any, output_tokens: Any) -> Chunk:
    return {
        "type": "finish",
        "payload": {
            "finishReason": STOP_REASONS.get(stop_reason or "end_turn", "other"),
            "usage": usage(input_tokens, output_tokens),
        },
    }


class AnthropicModel(HTTPModel):
    """A Messages API model (``max_tokens`` from the provider's ``maxTokens``, default 4096)."""

    settings: ClassVar[dict[str, str]] = _SETTINGS

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for `request` (without the stream flag)."""
        system, messages = convert_prompt(request.prompt)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.connection.config.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": messages,
        }
        if system:
            body["system"] = system
        for key, wire in self.settings.items():
            if request.model_settings.get(key) is not None:
                body[wire] = request.model_settings[key]
        if request.tools:
            body["tools"] = [
                {
                    "name": t["name"],
                    "description": t.get("description") or "",
                    "input_schema": tool_parameters(t),
                }
                for t in request.tools
            ]
            choice = convert_tool_choice(request.tool_choice)
            if choice is not None:
                body["tool_choice"] = choice
        body.update(request.provider_options.get(self.connection.config.kind) or {})
        return body

    def model_fetches(self, media_type: str) -> bool:
        """The Messages API fetches image and PDF URLs; other documents must be sent inline."""
        return media_type.startswith("image/") or media_type == "application/pdf"

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        key = self.connection.api_key(self.model_id)
        if key:
            headers["x-api-key"] = key
        return headers

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[Chunk, None]:
        url = f"{self.connection.config.base_url}/v1/messages"
        headers = self._headers()
        body = self.body(request)
        client = self.connection.client
        if not request.streaming:
            answer = await post_json(client, url, headers=headers, body=body)
            for chunk in self._from_message(answer):
                yield chunk
            return
        body["stream"] = True
        state = _StreamState(self.model_id)
        async with contextlib.aclosing(post_sse(client, url, headers=headers, body=body)) as events:
            async for event in events:
                if not event.data.strip():
                    continue
                payload = parse_json(event.data, f"a stream event of {self.model_id}")
                if isinstance(payload, dict):
                    for chunk in state.feed(event.event, payload, event.data):
                        yield chunk
                if state.stopped:
                    break
        if not state.stopped:
            raise stream_cut(self.model_id, "message_stop")
        yield state.finish()

    def _from_message(self, answer: Any) -> Iterator[Chunk]:
        if not isinstance(answer, dict):
            answer = {}
        if answer.get("type") == "error":
            raise error_from_payload(answer, status=None, body=json.dumps(answer))
        blocks = answer.get("content") or []
        for index, block in enumerate(blocks):
            if block.get("type") == "thinking" and block.get("thinking"):  # as the stream gives it
                signed = {"anthropic": {"signature": block["signature"]}} if block.get("signature") else {}
                yield {"type": "reasoning-delta", "payload": {"id": f"r{index}", "text": block["thinking"]}}
                yield {"type": "reasoning-end", "payload": {"id": f"r{index}", "providerMetadata": signed}}
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        if text:
            yield {"type": "text-delta", "payload": {"id": "t0", "text": text}}
        for block in blocks:
            if block.get("type") == "text":
                yield from _sources(block.get("citations") or [])
        for block in blocks:
            if block.get("type") == "tool_use":
                yield _tool_call(block.get("id", ""), block.get("name", ""), block.get("input") or {})
        raw = answer.get("usage") or {}
        yield _finish(answer.get("stop_reason"), raw.get("input_tokens"), raw.get("output_tokens"))
