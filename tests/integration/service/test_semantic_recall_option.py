"""A call's ``memory.options.semanticRecall: true`` for an agent whose memory configures no semantic
recall: the reference merges the option over the memory's config and recalls with the memory's
vector store and embedder; procmesh's agent has none, so the call runs with a warning naming it
and ``procmesh_call_settings_ignored_total{setting="memory.options.semanticRecall"}`` (it used to
do nothing, silently). The in-process service over real HTTP, a SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

SETTING = "memory.options.semanticRecall"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    config = {
        "storage": {"backend": "sqlite", "dataDir": str(Path(tmp_path_factory.mktemp("recall-option")))},
        "models": {"answer": {"provider": "scripted", "responses": [{"text": "ok"}] * 20}},
        "agents": {
            "keeper": {"model": "answer", "errorProcessorDefaults": False, "memory": {"lastMessages": 5}}
        },
    }
    svc = Service(OrchestratorSettings(http_port=0, grpc_port=0), parse_config(config))
    async with svc, httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=20) as client:
        yield client


def _call(recall: bool) -> dict[str, Any]:
    memory = {"thread": "t1", "resource": "ada", "options": {"semanticRecall": recall}}
    return {"messages": "hi", "memory": memory}


async def test_semantic_recall_asked_of_a_memory_without_it_runs_with_a_warning(
    http: httpx.AsyncClient,
) -> None:
    response = await http.post("/api/agents/keeper/generate", json=_call(True))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "success"
    assert body["warnings"] == [
        {
            "type": "unsupported-setting",
            "setting": SETTING,
            "details": "the agent's memory has no semanticRecall (no embedder): nothing is recalled, "
            "only its message history loaded",
        }
    ]
    metrics = (await http.get("/metrics")).text
    assert f'procmesh_call_settings_ignored_total{{setting="{SETTING}"}} 1.0' in metrics
    # turning it off asks for what the agent does anyway: nothing to say
    response = await http.post("/api/agents/keeper/generate", json=_call(False))
    assert response.json()["warnings"] == []
