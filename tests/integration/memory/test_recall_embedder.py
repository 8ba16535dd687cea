"""Semantic recall's embedding calls against the real local embeddings server (a real process):
the search finds by meaning, every call is counted and traced like a model call, and a failing
embedder is counted and leaves the turn unembedded instead of failing it; the calls are charged to
cost control at the embedder's price."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from procmesh import tracing
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.config.providers import ProviderConfig
from procmesh_orchestrator.config.recall import SemanticRecallConfig
from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.providers._base import ProviderConnection
from procmesh_orchestrator.providers.embeddings import EmbeddingModel
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.framework.recall import SemanticRecall, search_messages
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.integration.memory.local_embeddings import local_embeddings

MODEL = "wordllama-l2-supercat-256"
EMBEDDER = f"local/{MODEL}"


def msg(mid: str, role: str, text: str) -> dict[str, Any]:
    return {"id": mid, "role": role, "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}


@pytest.fixture(scope="module")
def embeddings_url() -> Iterator[str]:
    with local_embeddings() as url:
        yield url


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteMemoryStore]:
    opened = SqliteMemoryStore(tmp_path / "memory.db")
    await opened.start()
    yield opened
    await opened.close()


@pytest_asyncio.fixture
async def connections() -> AsyncIterator[list[ProviderConnection]]:
    made: list[ProviderConnection] = []
    yield made
    for connection in made:
        await connection.aclose()


def recall_of(
    url: str, store: SqliteMemoryStore, metrics: OrchestratorMetrics, connections: list[ProviderConnection]
) -> SemanticRecall:
    connection = ProviderConnection("local", ProviderConfig(kind="openai", base_url=url))
    connections.append(connection)
    config = SemanticRecallConfig(embedder=EMBEDDER, top_k=1, message_range=0)
    return SemanticRecall(config, EmbeddingModel(connection, MODEL), store, metrics)


def calls(metrics: OrchestratorMetrics, purpose: str, outcome: str) -> float:
    labels = {"model": EMBEDDER, "purpose": purpose, "outcome": outcome}
    return metrics.registry.get_sample_value("procmesh_embedding_calls_total", labels) or 0.0


async def test_turns_are_embedded_once_and_searched_by_meaning_counted_and_traced(
    embeddings_url: str,
    store: SqliteMemoryStore,
    monkeypatch: pytest.MonkeyPatch,
    connections: list[ProviderConnection],
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    metrics = OrchestratorMetrics()
    recall = recall_of(embeddings_url, store, metrics, connections)
    run = SimpleNamespace(run_id="r1", cost=None)
    turns = [
        [msg("a1", "user", "My dog Rex loves chasing balls in the park."), msg("a2", "assistant", "Nice!")],
        [msg("b1", "user", "The quarterly report is due on Friday."), msg("b2", "assistant", "Noted.")],
    ]
    for i, turn in enumerate(turns):
        embeddings = await recall.embed_turn(run, turn)  # type: ignore[arg-type]
        assert [e.message_id for e in embeddings] == [m["id"] for m in turn]
        await store.save_turn(f"t{i}", "u1", turn, embeddings=embeddings)

    pet = await search_messages(recall, "What is my pet called?", resource_id="u1")
    assert [m["id"] for m in pet.messages] == ["a1"]
    report = await search_messages(recall, "When is the report due?", resource_id="u1")
    assert [m["id"] for m in report.messages] == ["b1"]
    assert (await search_messages(recall, "What is my pet called?", resource_id="u2")).messages == []

    assert calls(metrics, "turn", "ok") == 2  # one call per turn, never again
    assert calls(metrics, "query", "ok") == 3
    tokens = metrics.registry.get_sample_value("procmesh_embedding_tokens_total", {"model": EMBEDDER})
    assert tokens is not None
    assert tokens > 10
    spans = [s for s in exporter.get_finished_spans() if s.name == f"embeddings {EMBEDDER}"]
    assert len(spans) == 5
    attributes = spans[0].attributes or {}
    assert attributes["gen_ai.operation.name"] == "embeddings"
    assert attributes["procmesh.embedding.purpose"] == "turn"
    assert int(attributes["gen_ai.usage.input_tokens"]) > 0  # type: ignore[arg-type]


async def test_a_failing_embedder_is_counted_and_the_turn_goes_unembedded(
    store: SqliteMemoryStore, connections: list[ProviderConnection]
) -> None:
    metrics = OrchestratorMetrics()
    recall = recall_of(
        "http://127.0.0.1:9/v1", store, metrics, connections
    )  # nothing listens on the discard port
    run = SimpleNamespace(run_id="r1", cost=None)
    assert await recall.embed_turn(run, [msg("a1", "user", "hello")]) == []  # type: ignore[arg-type]
    with pytest.raises(APICallError, match="cannot connect"):
        await search_messages(recall, "hello", resource_id="u1")
    assert calls(metrics, "turn", "error") == 1
    assert calls(metrics, "query", "error") == 1


async def test_embedding_calls_are_charged_to_cost_control(embeddings_url: str, tmp_path: Path) -> None:
    # the chat model is free and the embedder dear (a unit per token): only the embedding calls
    # (the second turn's query, the first turn's saved messages) can bring the resource to its limit
    config = parse_config(
        {
            "storage": {"backend": "sqlite", "path": str(tmp_path / "memory.db")},
            "providers": {"local": {"kind": "openai", "baseUrl": embeddings_url}},
            "models": {"main": {"provider": "scripted", "responses": [{"text": "ok"}] * 4}},
            "prices": {
                "main": {"input": 0.0, "output": 0.0},
                EMBEDDER: {"input": 1_000_000.0, "output": 0.0},
            },
            "agents": {
                "a": {
                    "model": "main",
                    "errorProcessorDefaults": False,
                    "memory": {"semanticRecall": {"embedder": EMBEDDER, "topK": 1, "messageRange": 0}},
                    "inputProcessors": [
                        {
                            "processor": "token-cost-control",
                            "options": {"max_cost": 1000.0, "strategy": "warn", "scope": "resource"},
                        }
                    ],
                }
            },
        }
    )
    options = CallOptions(resource_id="u1", thread_id="t1")
    async with App(config) as app:
        first = await app.agent("a").generate("My dog Rex loves chasing balls in the park.", options)
        second = await app.agent("a").generate("What is my pet called?", options)
        assert app.store is not None
        spent = await app.store.spent_cost("resource:u1", window_seconds=3600)
        tokens = app.metrics.registry.get_sample_value("procmesh_embedding_tokens_total", {"model": EMBEDDER})
    assert (first.status, second.status) == ("success", "success")
    assert tokens is not None
    assert tokens > 0
    assert spent == round(tokens * 1e9)  # every embedded token at the embedder's price (nano-units)
