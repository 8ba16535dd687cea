"""``memory.semanticRecall`` in the configuration: the reference's options and defaults, and each
refusal naming its key."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.run.framework.recall import CHARS_PER_TOKEN, chunk_text
from procmesh_orchestrator.store.recall import Range

LOCAL = {"local": {"kind": "openai", "baseUrl": "http://127.0.0.1:8081/v1"}}


def config(recall: dict[str, Any], providers: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "providers": LOCAL if providers is None else providers,
        "agents": {"a": {"model": "demo", "memory": {"semanticRecall": recall}}},
    }


def test_the_reference_defaults_and_both_range_forms() -> None:
    memory = parse_config(config({"embedder": "local/m"})).agents["a"].memory
    assert memory is not None
    recall = memory.semantic_recall
    assert recall is not None
    assert (recall.top_k, recall.span, recall.scope, recall.threshold) == (4, Range(1, 1), "resource", None)
    given = {"embedder": "local/m", "messageRange": {"before": 2, "after": 0}, "scope": "thread", "topK": 9}
    memory = parse_config(config(given)).agents["a"].memory
    assert memory is not None
    assert memory.semantic_recall is not None
    assert memory.semantic_recall.span == Range(2, 0)
    assert memory.semantic_recall.scope == "thread"


@pytest.mark.parametrize(
    ("recall", "providers", "words"),
    [
        ({"embedder": "m"}, None, "embedder must be 'provider/model-id'"),
        ({"embedder": "nowhere/m"}, None, "semanticRecall.embedder: unknown provider 'nowhere'"),
        ({"embedder": "anthropic/m"}, None, "semanticRecall.embedder: an embedder is a model of an 'openai'"),
        ({"embedder": "local/m", "topK": 0}, None, "topK"),
        ({"embedder": "local/m", "messageRange": -1}, None, "messageRange"),
        ({"embedder": "local/m", "scope": "org"}, None, "scope"),
        ({"embedder": "local/m", "vector": "pg"}, None, "vector"),
    ],
)
def test_a_bad_option_is_named(recall: dict[str, Any], providers: dict[str, Any] | None, words: str) -> None:
    with pytest.raises(ConfigError, match="semanticRecall") as caught:
        parse_config(config(recall, providers))
    assert words in str(caught.value)


def test_text_is_chunked_as_the_reference_does() -> None:
    assert chunk_text("short text") == ["short text"]
    size = 4096 * CHARS_PER_TOKEN
    words = ["word"] * (size // 5 + 10)  # a little over one chunk of 5-character words
    chunks = chunk_text(" ".join(words))
    assert len(chunks) == 2
    assert all(len(c) <= size for c in chunks)
    assert " ".join(chunks).split() == words
    assert chunk_text("x" * (size + 3)) == ["x" * size, "xxx"]
