"""The built-in models: `scripted` (answers from a list: the conformance scenarios' model) and
`demo` (deterministic, offline: the demo's), and `make_model` for a config's ``models`` entry."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

from procmesh_orchestrator.config import ModelConfig
from procmesh_orchestrator.errors import APICallError, ConfigError
from procmesh_orchestrator.run.models import Chunk, ModelProvider, ModelRequest


def _usage(spec: dict[str, Any]) -> dict[str, int]:
    usage = spec.get("usage") or {}
    inp, out = int(usage.get("inputTokens", 10)), int(usage.get("outputTokens", 5))
    return {"inputTokens": inp, "outputTokens": out, "totalTokens": inp + out}


def split_deltas(text: str) -> list[str]:
    """Split text before every space: ``"hello world"`` gives ``["hello", " world"]``."""
    return [piece for piece in re.split(r"(?= )", text) if piece]


class ScriptedModel:
    """Answers from a list of responses, one per call (the conformance scenarios' model).

    A response is ``{"text": ...}`` (optionally ``"deltas": [...]``),
    ``{"toolCalls": [{"name", "args"}]}`` (with optional text first),
    or ``{"error": {"status", "message", "retryable"}}``; ``"usage"`` is optional. An error with
    text (or deltas) streams the text, then fails: a call that fails mid-stream.
    """

    def __init__(
        self,
        responses: list[dict[str, Any]],
        *,
        model_id: str = "scripted",
        delay_ms: float = 0.0,
        specification_version: str = "v2",
    ) -> None:
        self.model_id = model_id
        self.specification_version = specification_version
        self._responses = list(responses)
        self._next = 0
        self._tool_call_ids = 0
        self._delay = delay_ms / 1000.0
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        """Stream the next scripted response."""
        self.requests.append(request)
        spec: dict[str, Any] = (
            self._responses[self._next]
            if self._next < len(self._responses)
            else {"text": "(script exhausted)"}
        )
        self._next += 1
        deltas = list(spec["deltas"]) if "deltas" in spec else split_deltas(spec.get("text", ""))
        if deltas and not request.streaming:
            deltas = ["".join(deltas)]
        for i, text in enumerate(deltas):
            if self._delay and i:
                await asyncio.sleep(self._delay)
            yield {"type": "text-delta", "payload": {"id": "t0", "text": text}}
        if "error" in spec:
            err = spec["error"]
            raise APICallError(
                err.get("message", "API error"),
                status=int(err.get("status", 400)),
                retryable=bool(err.get("retryable", False)),
                body=str(err.get("body", "")),
            )
        calls = spec.get("toolCalls") or []
        for call in calls:
            self._tool_call_ids += 1
            yield {
                "type": "tool-call",
                "payload": {
                    "toolCallId": f"call_{self._tool_call_ids}",
                    "toolName": call["name"],
                    "args": call.get("args", {}),
                },
            }
        reason = spec.get("finishReason") or ("tool-calls" if calls else "stop")
        yield {"type": "finish", "payload": {"finishReason": reason, "usage": _usage(spec)}}


class DemoModel:
    """A deterministic offline model for the demo: no key, no network.

    It answers the last user turn. When the last turn is a ``<system-reminder>``
    (a processor's retry feedback), it follows it and answers briefly; when a
    tool is offered and the user asks about the weather, it calls the tool once.
    """

    def __init__(
        self, delay_ms: float = 0.0, model_id: str = "demo", specification_version: str = "v2"
    ) -> None:
        self.model_id = model_id
        self.specification_version = specification_version
        self._delay = delay_ms / 1000.0
        self._calls = 0

    def _answer(self, request: ModelRequest) -> tuple[str, list[dict[str, Any]]]:
        turns = [m for m in request.prompt if m["role"] in ("user", "tool")]
        last: dict[str, Any] = turns[-1] if turns else {"role": "user", "content": []}
        text = " ".join(
            p.get("text", "") for p in last["content"] if isinstance(p, dict) and p.get("type") == "text"
        )
        if last["role"] == "tool":
            result = last["content"][0].get("output")
            return f"The tool says: {result}. That should answer it.", []
        if text.startswith("<system-reminder"):
            return "Sorry, here it is in short: it works.", []
        tool_names = [t["name"] for t in request.tools]
        if "weather" in tool_names and "weather" in text.lower() and request.tool_choice != "none":
            return "Let me check.", [{"name": "weather", "args": {"city": "Paris"}}]
        return (
            f'You said: "{text}" Darn, this demo model always answers at some length, '
            "because it wants to show every processor at work in one stream.",
            [],
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        """Stream a canned answer derived from the prompt."""
        text, calls = self._answer(request)
        deltas = split_deltas(text) if request.streaming else [text]
        for i, piece in enumerate(deltas):
            if self._delay and i:
                await asyncio.sleep(self._delay)
            yield {"type": "text-delta", "payload": {"id": "t0", "text": piece}}
        for call in calls:
            self._calls += 1
            yield {
                "type": "tool-call",
                "payload": {
                    "toolCallId": f"demo_{self._calls}",
                    "toolName": call["name"],
                    "args": call["args"],
                },
            }
        usage = {"inputTokens": 20, "outputTokens": len(deltas), "totalTokens": 20 + len(deltas)}
        yield {
            "type": "finish",
            "payload": {"finishReason": "tool-calls" if calls else "stop", "usage": usage},
        }


def make_model(name: str, config: ModelConfig) -> ModelProvider:
    """Build the model a config entry describes."""
    if config.provider == "scripted":
        return ScriptedModel(
            config.responses,
            model_id=name,
            delay_ms=config.delay_ms,
            specification_version=config.specification_version,
        )
    if config.provider == "demo":
        return DemoModel(config.delay_ms, name, config.specification_version)
    raise ConfigError(f"models.{name}.provider: unknown provider {config.provider!r}")
