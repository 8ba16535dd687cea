"""client-js ``searchMemory``'s route with semantic recall, on real processes: the orchestrator,
the local embeddings server (WordLlama) and the fake OpenAI API test_semantic_recall chats with.
The search is the recall's: "what is my pet called" finds the dog, not the report, with a score."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.memory.test_semantic_recall import (
    DOG,
    REPORT,
    TEA,
    TRUSTED,
    ask,
    chat_model,
    config,
    embeddings_url,
)
from tests.e2e.service.conftest import OrchestratorProcess, start_orchestrator
from tests.integration.providers.fakes import FakeOpenAI

pytestmark = pytest.mark.e2e

__all__ = ["chat_model", "embeddings_url", "start_orchestrator"]


def search(orchestrator: OrchestratorProcess, query: str, **extra: str) -> dict[str, Any]:
    params = {"agentId": "pal", "resourceId": "u1", "searchQuery": query, **extra}
    response = httpx.get(f"{orchestrator.http_url}/api/memory/search", params=params, timeout=60)
    assert response.status_code == 200, response.text + orchestrator.log()
    found: dict[str, Any] = response.json()
    return found


def test_search_memory_is_the_semantic_recalls_search(
    tmp_path: Path,
    start_orchestrator: Callable[..., OrchestratorProcess],
    chat_model: FakeOpenAI,
    embeddings_url: str,
) -> None:
    storage = {"backend": "sqlite", "path": str(tmp_path / "memory.db")}
    orchestrator = start_orchestrator(config(storage, chat_model.base_url, embeddings_url), env=TRUSTED)
    for text in (DOG, REPORT, TEA):
        ask(orchestrator, chat_model, text, "t1")

    pet = search(orchestrator, "What is my pet called?")
    assert (pet["searchType"], pet["searchScope"], pet["count"]) == ("semantic", "resource", 1)  # topK 1
    (hit,) = pet["results"]
    assert (hit["content"], hit["threadId"], hit["role"]) == (DOG, "t1", "user")
    assert 0 < hit["score"] <= 1
    assert [m["content"]["parts"][0]["text"] for m in hit["context"]["after"]] == ["Noted."] * 1 + [REPORT]

    report = search(orchestrator, "When is the quarterly report due?", threadId="t1")
    assert [r["content"] for r in report["results"]] == [REPORT]
    # another resource's memory is never searched
    other = search(orchestrator, "What is my pet called?", resourceId="u2")
    assert other["results"] == []
