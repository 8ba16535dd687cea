"""Background tool calls (SEED-GAPS L4) through a `procmesh-orchestrator` process over HTTP: a real
tool sidecar (`tests.fixtures.background_sidecar`) and the builtins' background-work-signals over
gRPC. The streamed run gets the placeholder at once, then work-deferred and work-completed; the
thread the memory API reads has the real result; a result landing after the run ended is stored by
the process all the same; executeTool answers with the tool's own result. Gate files the tools
wait for decide when work lands (no clock).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.service.durable_harness import sse_records

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

STARTED = "Background task started. Task ID: "
MEMORY = {"thread": "t1", "resource": "r1"}


def orchestrator_config(tools: str, signals: str, store: Path, gate: Path) -> dict[str, Any]:
    steps = [
        [{"name": "research", "args": {"topic": "tides"}}, {"name": "hold", "args": {"gate": str(gate)}}],
        [{"name": "research", "args": {"topic": "moon", "gate": str(gate) + ".late"}}],
    ]
    responses = [{"toolCalls": steps[0]}, {"text": "done"}, {"toolCalls": steps[1]}, {"text": "started"}]
    return {
        "sidecars": {"bg": {"address": tools}, "bi": {"address": signals}},
        "tools": {"research": {"sidecar": "bg", "background": {}}, "hold": {"sidecar": "bg"}},
        "models": {"m": {"provider": "scripted", "responses": responses}},
        "storage": {"path": str(store)},
        "agents": {
            "a": {
                "model": "m",
                "errorProcessorDefaults": False,
                "tools": ["research", "hold"],
                "memory": {},
                "inputProcessors": ["bi/background-work-signals"],
            }
        },
    }


async def stream(http: httpx.AsyncClient, text: str, on_chunk: Callable[[dict[str, Any]], None]) -> list[Any]:
    chunks = []
    body = {"messages": text, "memory": MEMORY}
    async with http.stream("POST", "/api/agents/a/stream", json=body) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        async for _, data in sse_records(response):
            if data == "[DONE]":
                break
            chunks.append(json.loads(data))
            on_chunk(chunks[-1])
    return chunks


async def invocations(http: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    response = await http.get("/api/memory/threads/t1/messages", params={"agentId": "a", "resourceId": "r1"})
    assert response.status_code == 200, response.text
    return {
        part["toolInvocation"]["toolCallId"]: part["toolInvocation"]
        for msg in response.json()["messages"]
        for part in (msg.get("content") or {}).get("parts") or []
        if part.get("type") == "tool-invocation"
    }


def signals(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["data"]["contents"] for c in chunks if c["type"] == "data-signal"]


async def test_background_work_over_http(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path: Path,
) -> None:
    tools = start_sidecar(name="bgh", module="tests.fixtures.background_sidecar")
    builtin = start_sidecar("background-work-signals", name="bih")
    await asyncio.gather(tools.wait_ready(), builtin.wait_ready())
    gate = tmp_path / "gate"
    config = orchestrator_config(tools.address, builtin.address, tmp_path / "m.db", gate)
    orchestrator = await asyncio.to_thread(start_orchestrator, config)

    def opened(chunk: dict[str, Any]) -> None:
        if chunk["type"] == "data-signal" and chunk["data"]["tagName"] == "work-completed":
            gate.touch()  # the foreground `hold` returns, and the run goes on

    async with httpx.AsyncClient(base_url=orchestrator.http_url, timeout=30) as http:
        chunks = await stream(http, "research tides", opened)
        research, _ = (c["payload"] for c in chunks if c["type"] == "tool-result")
        assert research["result"].startswith(STARTED)
        call_id = research["toolCallId"]
        assert signals(chunks) == [f"work-deferred: {call_id}", f"work-completed: {call_id}"]
        assert (await invocations(http))[call_id]["result"] == {
            "topic": "tides",
            "findings": "notes on tides",
        }

        # a second run's work lands after that run ended: stored by the process, no signal
        chunks = await stream(http, "research the moon", lambda c: None)
        (late,) = (c["payload"] for c in chunks if c["type"] == "tool-result")
        assert signals(chunks) == [f"work-deferred: {late['toolCallId']}"]
        assert (await invocations(http))[late["toolCallId"]]["result"].startswith(STARTED)
        await asyncio.to_thread(Path(str(gate) + ".late").touch)
        for _ in range(500):  # poll the thread (at most 10 s) until the process stored the result
            stored = (await invocations(http))[late["toolCallId"]]["result"]
            if not isinstance(stored, str):
                break
            await asyncio.sleep(0.02)
        assert stored == {"topic": "moon", "findings": "notes on moon"}

        # executeTool runs the tool itself (background is how a run calls it, as in the reference)
        body = {"data": {"topic": "reefs"}}
        response = await http.post("/api/agents/a/tools/research/execute", json=body)
        assert response.status_code == 200, response.text
        assert response.json() == {"topic": "reefs", "findings": "notes on reefs"}
