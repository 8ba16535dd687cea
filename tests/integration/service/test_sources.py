"""The sources a model cites reach the client as the reference sends them (issue 30 item 1): a
web-search model's ``url_citation`` annotations (a fake OpenAI chat-completions API on a real
socket) are ``source`` chunks in the stream and the result's and the step's ``sources``; an
OpenAI-compatible API's ``reasoning_content`` is the result's reasoning."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.providers.fakes import FakeOpenAI
from tests.integration.service.support import stream_chunks

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

CITED = [{"url": "https://example.com/paris", "title": "Paris weather"}]
SOURCE = {"id": CITED[0]["url"], "sourceType": "url", **CITED[0]}


@pytest.fixture(scope="module")
def openai_api() -> Iterator[FakeOpenAI]:
    api = FakeOpenAI().start()
    api.script("searcher", {"text": "It is sunny in Paris.", "sources": CITED})
    api.script("reasoner", {"reasoning": "Paris is in France.", "text": "Sunny."})
    yield api
    api.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(openai_api: FakeOpenAI) -> AsyncIterator[httpx.AsyncClient]:
    config = {
        "providers": {"fake": {"kind": "openai", "baseUrl": openai_api.base_url}},
        "agents": {
            "search": {"model": "fake/searcher", "errorProcessorDefaults": False},
            "reason": {"model": "fake/reasoner", "errorProcessorDefaults": False},
        },
    }
    settings = OrchestratorSettings(http_port=0, grpc_port=0)
    async with (
        Service(settings, parse_config(config)) as svc,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=20) as client,
    ):
        yield client


async def test_a_generate_result_lists_the_cited_sources(http: httpx.AsyncClient) -> None:
    body = (await http.post("/api/agents/search/generate", json={"messages": "weather?"})).json()
    assert body["text"] == "It is sunny in Paris."
    (source,) = body["sources"]
    assert (source["type"], source["runId"], source["payload"]) == ("source", body["runId"], SOURCE)
    assert body["steps"][0]["sources"] == body["sources"]


async def test_a_stream_sends_a_source_chunk_after_the_text(http: httpx.AsyncClient) -> None:
    chunks = [c for c in await stream_chunks(http, "search", {"messages": "weather?"}) if isinstance(c, dict)]
    types = [c["type"] for c in chunks]
    assert types.index("text-end") < types.index("source") < types.index("step-finish")
    (source,) = [c for c in chunks if c["type"] == "source"]
    assert source["payload"] == SOURCE


async def test_an_openai_compatible_apis_reasoning_content_is_the_results_reasoning(
    http: httpx.AsyncClient,
) -> None:
    body = (await http.post("/api/agents/reason/generate", json={"messages": "weather?"})).json()
    assert (body["text"], body["reasoningText"]) == ("Sunny.", "Paris is in France.")
    assert [r["payload"]["text"] for r in body["reasoning"]] == ["Paris is in France."]
    chunks = [c for c in await stream_chunks(http, "reason", {"messages": "weather?"}) if isinstance(c, dict)]
    types = [c["type"] for c in chunks]
    assert types.index("reasoning-start") < types.index("reasoning-end") < types.index("text-start")
