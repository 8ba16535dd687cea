"""What an aborted run leaves (SEED-GAPS C29), through a real sidecar's output processors: as in
the reference, onAbort gets the steps and the text so far, processOutputResult runs once (the
sidecar's ``tracker`` records it), and memory keeps the user's input and the streamed text. The
abort comes from the Python API (`RunStream.cancel`), an HTTP client leaving its stream, and the
run cancel route.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from procmesh_orchestrator.store import MemoryStore
from tests.e2e.tools.harness import Chunk, stats

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

WORDS = [f"word{i} " for i in range(40)]
ASK = "Count slowly."


def _config(py_tools: str, db: Path) -> dict[str, Any]:
    # 40 deltas 30 ms apart: every test aborts the run long before its end
    response = {"deltas": WORDS}
    return {
        "storage": {"backend": "sqlite", "path": str(db)},
        "sidecars": {"py": {"address": py_tools, "timeout": 5}},
        "models": {"slow": {"provider": "scripted", "delayMs": 30, "responses": [response] * 10}},
        "agents": {
            "a": {
                "model": "slow",
                "errorProcessorDefaults": False,
                "memory": {"lastMessages": 10},
                "outputProcessors": ["py/tracker"],
            }
        },
    }


async def _thread(store: MemoryStore, thread: str) -> list[tuple[str, str]]:
    return [(m["role"], message_text(m)) for m in await store.messages(thread, "u1")]


async def _processed_output_result(py_tools: str, run_id: str) -> bool:
    """Whether the sidecar's ``tracker`` saw processOutputResult for the run."""
    return "steps" in (await stats(py_tools, run_id))["run"]


async def test_cancel_keeps_the_turn_so_far_and_runs_process_output_result(
    py_tools: str, tmp_path: Path
) -> None:
    told: list[dict[str, Any]] = []

    async def on_abort(event: dict[str, Any]) -> None:
        told.append(event)

    options = CallOptions(thread_id="t1", resource_id="u1", on_abort=on_abort)
    async with App(parse_config(_config(py_tools, tmp_path / "m.db"))) as app:
        stream = app.agent("a").stream(ASK, options)
        chunks: list[Chunk] = []
        two = asyncio.Event()

        async def read() -> None:
            async for chunk in stream:
                chunks.append(chunk)
                if sum(c["type"] == "text-delta" for c in chunks) == 2:
                    two.set()

        reader = asyncio.create_task(read())
        async with asyncio.timeout(10):
            await two.wait()
            result = await stream.cancel()
            await reader
        stored = await _thread(await app.suspended_runs_store(), "t1")
    streamed = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
    assert result.status == "aborted"
    assert chunks[-1]["type"] == "abort"
    assert 2 <= len(streamed.split()) < len(WORDS)
    assert told == [{"steps": [], "text": streamed}]
    assert stored == [("user", ASK), ("assistant", streamed)]
    assert await _processed_output_result(py_tools, result.run_id)


async def _service(py_tools: str, db: Path) -> AsyncIterator[Service]:
    settings = OrchestratorSettings(http_port=0, grpc_port=0, api_keys=[SecretStr("key-admin=@operator")])
    async with Service(settings, parse_config(_config(py_tools, db))) as service:
        yield service


def _client(service: Service) -> httpx.AsyncClient:
    """An operator's client (it names the resource, and may cancel the run)."""
    url = f"http://127.0.0.1:{service.http_port}"
    return httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer key-admin"}, timeout=20)


async def _stream_until_two_deltas(http: httpx.AsyncClient, thread: str) -> AsyncIterator[str]:
    """Open a stream and yield its run id once two text deltas arrived (the stream stays open)."""
    body = {"messages": ASK, "memory": {"thread": thread, "resource": "u1"}}
    async with http.stream("POST", "/api/agents/a/stream", json=body) as response:
        deltas = 0
        run_id = ""
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk["type"] == "start":
                run_id = chunk["payload"]["runId"]
            deltas += chunk["type"] == "text-delta"
            if deltas == 2:
                yield run_id
                return


async def _saved(service: Service, thread: str) -> list[tuple[str, str]]:
    """The thread once the aborted run saved its turn (bounded: a run that saves nothing fails)."""
    store = await service.app.suspended_runs_store()
    async with asyncio.timeout(10):
        while not (stored := await _thread(store, thread)):  # noqa: ASYNC110 - polling the store
            await asyncio.sleep(0.05)
    return stored


async def test_an_http_client_leaving_its_stream_keeps_the_turn_so_far(py_tools: str, tmp_path: Path) -> None:
    async for service in _service(py_tools, tmp_path / "m.db"):
        async with _client(service) as http:
            run_id = ""
            async for started in _stream_until_two_deltas(http, "t-http"):
                run_id = started  # leaving the `async with` closes the connection: the run is aborted
        stored = await _saved(service, "t-http")
        assert stored[0] == ("user", ASK)
        (role, text), *rest = stored[1:]
        assert role == "assistant"
        assert not rest
        assert 2 <= len(text.split()) < len(WORDS)
        assert await _processed_output_result(py_tools, run_id)


async def test_the_cancel_route_keeps_the_turn_so_far(py_tools: str, tmp_path: Path) -> None:
    async for service in _service(py_tools, tmp_path / "m.db"):
        async with _client(service) as http:
            body = {"messages": ASK, "memory": {"thread": "t-route", "resource": "u1"}}
            async with http.stream("POST", "/api/agents/a/stream", json=body) as response:
                chunks: list[dict[str, Any]] = []
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunks.append(json.loads(line[len("data: ") :]))
                    if (
                        chunks[-1]["type"] == "text-delta"
                        and sum(c["type"] == "text-delta" for c in chunks) == 2
                    ):
                        run_id = chunks[0]["payload"]["runId"]  # the start chunk names it
                        cancelled = await http.post(f"/api/agents/a/runs/{run_id}/cancel")
                        assert cancelled.json() == {"cancelled": True}
        assert chunks[-1]["type"] == "abort"
        streamed = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
        assert await _saved(service, "t-route") == [("user", ASK), ("assistant", streamed)]
        assert await _processed_output_result(py_tools, run_id)
