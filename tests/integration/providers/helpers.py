"""Building provider models against the fakes and draining their streams."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.providers._base import HTTPModel
from procmesh_orchestrator.run import CallOptions, RunResult
from procmesh_orchestrator.run.loop import Run
from procmesh_orchestrator.run.models import ModelProvider, ModelRequest

Chunk = dict[str, Any]
MakeModel = Callable[..., HTTPModel]
# What the default stream-error-retry processor matches (sidecars/error_defaults.py).
CONNECTION_RESET = re.compile(r"ECONNRESET|connection reset|socket hang up|connection (was )?closed", re.I)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def message(role: str, *parts: dict[str, Any]) -> dict[str, Any]:
    """A stored (format 2) message, as a caller's input or history holds it."""
    return {"role": role, "content": {"format": 2, "parts": list(parts)}}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


async def run_keeping_history(
    app: App, agent_id: str, input: list[dict[str, Any]], options: CallOptions | None = None
) -> tuple[RunResult, list[Any]]:
    """generate(), also returning the run's stored message list (to show it was not rewritten)."""
    agent = app.agent(agent_id)
    run = Run(agent.spec, input, options or CallOptions(), sink=None, metrics=agent.metrics)
    result, failure = await run.execute()
    assert failure is None, failure
    return result, run.ml.items


def request(*prompt: dict[str, Any], streaming: bool = True, **kw: Any) -> ModelRequest:
    return ModelRequest(prompt=list(prompt) or [user("hi")], streaming=streaming, **kw)


async def drain(model: ModelProvider, req: ModelRequest) -> list[Chunk]:
    return [chunk async for chunk in model.stream(req)]


async def failure(model: ModelProvider, req: ModelRequest) -> tuple[list[Chunk], APICallError]:
    """The chunks that arrived before the stream failed, and the error."""
    chunks: list[Chunk] = []
    with pytest.raises(APICallError) as info:
        await collect(model.stream(req), chunks)
    return chunks, info.value


async def collect(stream: AsyncIterator[Chunk], into: list[Chunk]) -> None:
    """Append every chunk of `stream` to `into` (what arrived stays there when it fails)."""
    async for chunk in stream:
        into.append(chunk)


def text_of(chunks: list[Chunk]) -> str:
    return "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")


def finish_of(chunks: list[Chunk]) -> dict[str, Any]:
    finishes = [c for c in chunks if c["type"] == "finish"]
    assert len(finishes) == 1
    assert chunks[-1] is finishes[0]
    return dict(finishes[0]["payload"])
