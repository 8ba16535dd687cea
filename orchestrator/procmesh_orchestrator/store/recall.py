"""Semantic recall's vectors: each stored message's embedding, kept with its turn, and the search.

A turn's embeddings are written by `ThreadStore.save_turn` (``embeddings=``) in the turn's own
transaction, so a message is never stored without them and history is never embedded again. The
search is `RecallIndex.nearest` (the ``topK`` messages most like a query, in the resource or in one
thread) and `RecallIndex.around` (each hit with its thread's neighbours: the reference's
``messageRange``). `recall_index` gives the one of a store: on PostgreSQL the pgvector extension's
HNSW index (created at first use; a clear error names the extension when the server lacks it), on
SQLite an exact search over the scope's rows (this Python's sqlite3 loads no extension).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from procmesh_orchestrator.store.threads import Message


@dataclass(frozen=True)
class MessageEmbedding:
    """One chunk of one message's text, embedded by `model` (the embedder's reference)."""

    message_id: str
    model: str
    vector: Sequence[float]
    chunk: int = 0


@dataclass(frozen=True)
class Hit:
    """A stored message like the query: its thread and its cosine similarity (1 is the same)."""

    thread_id: str
    message_id: str
    score: float


@dataclass(frozen=True)
class Range:
    """How many of a hit's thread's messages come with it: before it and after it."""

    before: int = 1
    after: int = 1


class RecallIndex(Protocol):
    """The search over the stored embeddings of one store."""

    async def nearest(
        self,
        model: str,
        vector: Sequence[float],
        *,
        resource_id: str,
        thread_id: str | None = None,
        top_k: int = 4,
    ) -> list[Hit]:
        """The `top_k` messages of the resource (of its thread `thread_id`, when given) whose
        embedding by `model` is most like `vector`, best first; a message once (its best chunk)."""

    async def around(self, resource_id: str, hits: Sequence[Hit], span: Range) -> list[Message]:
        """The hits' messages, each with `span` of its thread's messages before and after it,
        once each, by thread and in their order in it."""

    async def add(self, resource_id: str, thread_id: str, embeddings: Sequence[MessageEmbedding]) -> None:
        """Store embeddings of messages already in the thread (a bulk load: the benchmark, a
        backfill); a run's turn stores its own through `save_turn`."""


def recall_index(store: Any) -> RecallIndex:
    """The recall index of `store` (a started `MemoryStore` of either backend)."""
    from procmesh_orchestrator.store._recall import index_of

    return index_of(store)
