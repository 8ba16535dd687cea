"""What the tool tests share: a config builder, a streamed run's chunks, the model's prompts, stats."""

from __future__ import annotations

import asyncio
from typing import Any

from procmesh import ProcessorClient, convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run import CallOptions, RunResult, RunStream

Chunk = dict[str, Any]


def call(name: str, **args: Any) -> dict[str, Any]:
    """A scripted tool call."""
    return {"name": name, "args": args}


def config(
    *,
    sidecars: dict[str, dict[str, Any]] | None = None,
    tools: dict[str, dict[str, Any]] | None = None,
    responses: list[dict[str, Any]] | None = None,
    model: dict[str, Any] | None = None,
    top: dict[str, Any] | None = None,
    **agent: Any,
) -> Config:
    """One agent ``a`` on the scripted model ``m``; `agent` adds its keys (camelCase), `top` the
    config's (``storage``, ``mcpServers``)."""
    raw: dict[str, Any] = {
        "sidecars": sidecars or {},
        "tools": tools or {},
        "models": {"m": model or {"provider": "scripted", "responses": responses or [{"text": "done"}]}},
        "agents": {"a": {"model": "m", "errorProcessorDefaults": False, "tools": list(tools or {}), **agent}},
        **(top or {}),
    }
    return parse_config(raw, "test config")


def prompts(app: App) -> list[list[dict[str, Any]]]:
    """Every prompt the scripted model was sent, in order."""
    model = app.models["m"]
    assert isinstance(model, ScriptedModel)
    return [r.prompt for r in model.requests]


def offered(app: App, index: int = 0) -> dict[str, dict[str, Any]]:
    """The tools the model was offered in its `index`-th request, by name."""
    model = app.models["m"]
    assert isinstance(model, ScriptedModel)
    return {t["name"]: t for t in model.requests[index].tools}


def tool_outputs(prompt: list[dict[str, Any]]) -> dict[str, Any]:
    """The tool results a prompt shows the model, by call id."""
    return {
        part["toolCallId"]: part["output"]
        for message in prompt
        if message["role"] == "tool"
        for part in message["content"]
    }


async def drain(stream: RunStream) -> tuple[list[Chunk], RunResult]:
    """Every chunk of a streamed run, then its result."""
    chunks = [chunk async for chunk in stream]
    return chunks, await stream.result()


async def collect(
    app: App, text: str = "hi", options: CallOptions | None = None
) -> tuple[list[Chunk], RunResult]:
    """Stream agent ``a``'s run to its end."""
    return await drain(app.agent("a").stream(text, options))


def of_type(chunks: list[Chunk], kind: str) -> list[dict[str, Any]]:
    """The payloads of the chunks of one type."""
    return [c["payload"] for c in chunks if c["type"] == kind]


async def stats(address: str, run_id: str = "") -> dict[str, Any]:
    """The tool sidecar's counters (its ``stats`` tool, called straight over ExecuteTool)."""
    async with ProcessorClient(address) as client:
        request = ppb.ExecuteToolRequest(tool_name="stats", args=convert.to_value({"run_id": run_id}))
        answer = await client.call("ExecuteTool", request, 5.0)
    value = convert.from_value(answer.result)
    assert isinstance(value, dict)
    return value


async def settled_inflight(address: str) -> dict[str, Any]:
    """The in-flight counters once every call has ended (a cancelled call ends a moment after the
    run does: the cancellation crosses the wire); bounded, so a call left running fails the test."""
    async with asyncio.timeout(10):
        while True:
            inflight = (await stats(address))["inflight"]
            if not any(inflight.values()):
                return dict(inflight)
            await asyncio.sleep(0.05)
