"""Embedding models: an OpenAI-compatible ``POST {baseUrl}/embeddings`` through a configured provider.

An embedder is named like a chat model, ``provider/model-id``, and shares the provider's
`ProviderConnection` (its client, its key read from the environment in the orchestrator, its
provider-level retries), so no key ever leaves the orchestrator. Semantic recall embeds a query or
a turn's texts in one call (the run cuts long texts into chunks first, as the reference does:
`run.framework.recall.chunk_text`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.providers._base import ProviderConnection
from procmesh_orchestrator.providers._http import post_json

log = logging.getLogger(__name__)

_CHARS_PER_TOKEN = 4
"""A provider that reports no usage: its inputs' tokens estimated at about 4 characters each."""


@dataclass(frozen=True)
class Embeddings:
    """One call's vectors, in the order of its inputs, and the tokens the provider counted."""

    vectors: list[list[float]]
    tokens: int


class EmbeddingModel:
    """An embedding model of an ``openai``-kind provider (OpenAI, vLLM, Ollama, llama.cpp, TEI, the
    repository's local server)."""

    def __init__(self, connection: ProviderConnection, model: str) -> None:
        self.connection = connection
        self.model = model
        self.model_id = f"{connection.name}/{model}"

    async def embed(self, texts: list[str]) -> Embeddings:
        """The embeddings of `texts` (one vector each); `APICallError` on any failure."""
        conn = self.connection
        key = conn.api_key(self.model_id)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        url = f"{conn.config.base_url}/embeddings"
        body = {"model": self.model, "input": texts, "encoding_format": "float"}
        attempt = 0
        while True:
            try:
                answer = await post_json(conn.client, url, headers=headers, body=body)
                return _parse(answer, texts, url)
            except APICallError as exc:
                if not exc.retryable or attempt >= conn.retry.max_retries:
                    raise
                delay = conn.retry.delay_ms(attempt, exc)
                attempt += 1
                log.warning("%s: %s; retry %d in %.0f ms", self.model_id, exc.message, attempt, delay)
                await asyncio.sleep(delay / 1000)


def _parse(answer: Any, texts: list[str], url: str) -> Embeddings:
    count = len(texts)
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or len(data) != count:
        raise APICallError(
            f"{url}: expected {count} embeddings in 'data', got {type(data).__name__}",
            status=0,
            retryable=False,
        )
    ordered = sorted(data, key=lambda item: int(item.get("index", 0)) if isinstance(item, dict) else 0)
    vectors = []
    for item in ordered:
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(vector, list) or not vector or not all(isinstance(x, int | float) for x in vector):
            raise APICallError(f"{url}: an embedding is not a list of numbers", status=0, retryable=False)
        vectors.append([float(x) for x in vector])
    if len({len(v) for v in vectors}) > 1:
        raise APICallError(f"{url}: the embeddings differ in length", status=0, retryable=False)
    usage = answer.get("usage") or {}
    tokens = usage.get("prompt_tokens", usage.get("total_tokens")) if isinstance(usage, dict) else None
    if not isinstance(tokens, int):  # a server that counts none: the estimate cost control uses
        tokens = sum(math.ceil(len(t) / _CHARS_PER_TOKEN) for t in texts)
    return Embeddings(vectors, tokens)
