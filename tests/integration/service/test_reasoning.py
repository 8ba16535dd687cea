"""A model's reasoning and the pages it cites reach the client as the reference sends them (issue
30 item 1): an Anthropic model's signed thinking (a fake Anthropic API on a real socket) is the
result's ``reasoning`` and ``reasoningText``, each step's, a ``reasoning`` part of the stored
assistant message, and in a stream ``reasoning-start`` / ``reasoning-delta`` / ``reasoning-end``
before the text; the next turn sends the signed thinking back to the model. A text's
``web_search_result_location`` citations are ``source`` chunks and the result's ``sources``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.providers.fakes import FakeAnthropic
from tests.integration.service.support import stream_chunks

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

THINKING = {"text": "The user greets me, so I greet back.", "signature": "sig-abc"}
SIGNED = {"anthropic": {"signature": "sig-abc"}}


@pytest.fixture(scope="module")
def anthropic_api() -> Iterator[FakeAnthropic]:
    api = FakeAnthropic().start()
    api.script("claude", {"thinking": THINKING, "text": "Hello there."})
    api.script(
        "searcher", {"text": "Sunny in Paris.", "sources": [{"url": "https://example.com/p", "title": "P"}]}
    )
    yield api
    api.stop()


def _config(base_url: str, db: Path) -> dict[str, Any]:
    return {
        "storage": {"backend": "sqlite", "path": str(db)},
        "providers": {"fake": {"kind": "anthropic", "baseUrl": base_url}},
        "agents": {
            "searcher": {"model": "fake/searcher", "errorProcessorDefaults": False},
            "thinker": {
                "model": "fake/claude",
                "errorProcessorDefaults": False,
                "memory": {"lastMessages": 10},
            },
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(
    anthropic_api: FakeAnthropic, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    settings = OrchestratorSettings(http_port=0, grpc_port=0)
    db = tmp_path_factory.mktemp("reasoning") / "memory.db"
    async with (
        Service(settings, parse_config(_config(anthropic_api.base_url.removesuffix("/v1"), db))) as svc,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=20) as client,
    ):
        yield client


async def test_a_generate_result_carries_the_models_reasoning(
    http: httpx.AsyncClient, anthropic_api: FakeAnthropic
) -> None:
    memory = {"thread": "t1", "resource": "ada"}
    body = (await http.post("/api/agents/thinker/generate", json={"messages": "hi", "memory": memory})).json()
    assert (body["text"], body["reasoningText"]) == ("Hello there.", THINKING["text"])
    (chunk,) = body["reasoning"]
    assert (chunk["type"], chunk["runId"]) == ("reasoning", body["runId"])
    assert chunk["payload"] == {"id": "r0", "text": THINKING["text"], "providerMetadata": SIGNED}
    assert body["steps"][0]["reasoning"] == body["reasoning"]
    assert body["steps"][0]["content"][0] == {"type": "reasoning", "text": THINKING["text"]}
    (answer,) = body["response"]["messages"]
    reasoning = answer["content"]["parts"][0]
    assert (reasoning["type"], reasoning["text"], reasoning["providerMetadata"]) == (
        "reasoning",
        THINKING["text"],
        SIGNED,
    )
    # the next turn gives Anthropic its own signed thinking back, from the thread's history
    await http.post("/api/agents/thinker/generate", json={"messages": "and now?", "memory": memory})
    history = anthropic_api.calls("claude")[-1].body["messages"]
    sent = [block for m in history if m["role"] == "assistant" for block in m["content"]]
    assert {"type": "thinking", "thinking": THINKING["text"], "signature": "sig-abc"} in sent


async def test_a_stream_frames_the_reasoning_before_the_text(http: httpx.AsyncClient) -> None:
    chunks = [c for c in await stream_chunks(http, "thinker", {"messages": "hi"}) if isinstance(c, dict)]
    types = [c["type"] for c in chunks]
    start, end = types.index("reasoning-start"), types.index("reasoning-end")
    assert set(types[start + 1 : end]) == {"reasoning-delta"}
    assert end < types.index("text-start")
    assert "".join(c["payload"]["text"] for c in chunks if c["type"] == "reasoning-delta") == THINKING["text"]
    assert chunks[end]["payload"]["providerMetadata"] == SIGNED


async def test_the_web_pages_a_text_cites_are_sources(http: httpx.AsyncClient) -> None:
    source = {
        "id": "https://example.com/p",
        "sourceType": "url",
        "url": "https://example.com/p",
        "title": "P",
    }
    body = (await http.post("/api/agents/searcher/generate", json={"messages": "weather?"})).json()
    assert [s["payload"] for s in body["sources"]] == [source]
    chunks = [
        c for c in await stream_chunks(http, "searcher", {"messages": "weather?"}) if isinstance(c, dict)
    ]
    assert [c["payload"] for c in chunks if c["type"] == "source"] == [source]
