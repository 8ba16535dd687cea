"""Semantic recall in both stores: the embeddings' rows, the nearest-neighbour search, the ranges.

The rows (`message_embeddings`, migration 0008) are written in the turn's transaction
(`embedding_statements`, called by `save_turn`). PostgreSQL keeps them as REAL[] and searches
through a pgvector HNSW index over ``embedding::vector(dims)``, partial per dimension, created with
the extension at first search under the migrations' advisory lock. SQLite keeps float32 bytes and
computes every cosine of the scope's rows with numpy: exact, and its cost is in `make bench`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from procmesh_orchestrator.errors import MemoryStoreError
from procmesh_orchestrator.store._checks import check_count, check_id, decode
from procmesh_orchestrator.store._sql import Query, StoreHooks
from procmesh_orchestrator.store.recall import Hit, MessageEmbedding, Range, RecallIndex
from procmesh_orchestrator.store.threads import Message

MAX_TOP_K = 100
MAX_RANGE = 50
EXTENSION = "vector"
"""pgvector's extension name, as ``CREATE EXTENSION`` takes it."""


def _is_postgres(store: StoreHooks) -> bool:
    return store.placeholder == "%s"


def _vector_arg(store: StoreHooks, vector: Sequence[float]) -> Any:
    array = np.asarray(vector, dtype=np.float32)
    return [float(x) for x in array] if _is_postgres(store) else array.astype("<f4").tobytes()


def embedding_statements(
    store: StoreHooks, key: tuple[str, str], embeddings: Sequence[MessageEmbedding]
) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements that store `embeddings` of the thread `key` (``(resource_id, thread_id)``),
    each message's earlier ones replaced (a message saved again under its id is embedded again)."""
    p = store.placeholder
    vector = f"{p}::real[]" if _is_postgres(store) else p
    delete = (
        f"DELETE FROM message_embeddings WHERE resource_id = {p} AND thread_id = {p} "
        f"AND message_id = {p} AND model = {p}"
    )
    insert = (
        "INSERT INTO message_embeddings (resource_id, thread_id, message_id, model, chunk, dims, "
        f"embedding) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {vector})"
    )
    statements: list[tuple[str, tuple[Any, ...]]] = []
    cleared: set[tuple[str, str]] = set()
    for e in embeddings:
        message_id = check_id(store.name, "embedded message", e.message_id)
        if (message_id, e.model) not in cleared:
            cleared.add((message_id, e.model))
            statements.append((delete, (*key, message_id, e.model)))
        args = (*key, message_id, e.model, e.chunk, len(e.vector), _vector_arg(store, e.vector))
        statements.append((insert, args))
    return statements


class StoreRecall:
    """`RecallIndex` of one store: the SQL both share, and each backend's `nearest`."""

    def __init__(self, store: StoreHooks) -> None:
        self.store = store
        self._indexed: set[int] = set()
        """The dimensions whose HNSW index this process knows exists (PostgreSQL)."""

    async def nearest(
        self,
        model: str,
        vector: Sequence[float],
        *,
        resource_id: str,
        thread_id: str | None = None,
        top_k: int = 4,
    ) -> list[Hit]:
        store = self.store
        resource_id = check_id(store.name, "resource", resource_id)
        if thread_id is not None:
            thread_id = check_id(store.name, "thread", thread_id)
        top_k = check_count(store.name, "topK", top_k, low=1, high=MAX_TOP_K)
        query = np.asarray(vector, dtype=np.float32)
        if _is_postgres(store):
            return await self._pg_nearest(model, query, resource_id, thread_id, top_k)
        return await self._exact_nearest(model, query, resource_id, thread_id, top_k)

    async def _exact_nearest(
        self, model: str, query: np.ndarray, resource_id: str, thread_id: str | None, top_k: int
    ) -> list[Hit]:
        """Every cosine of the scope's rows (found through the primary key's prefix), the best kept."""
        p = self.store.placeholder
        where = f"resource_id = {p} AND model = {p} AND dims = {p}"
        args: tuple[Any, ...] = (resource_id, model, len(query))
        if thread_id is not None:
            where, args = f"{where} AND thread_id = {p}", (*args, thread_id)
        rows = await self.store._read(
            f"SELECT thread_id, message_id, embedding FROM message_embeddings WHERE {where}",
            args,
            "searching the stored embeddings",
        )
        if not rows:
            return []
        matrix = np.frombuffer(b"".join(row[2] for row in rows), dtype="<f4").reshape(len(rows), len(query))
        scores = (matrix @ query) / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(query) + 1e-12)
        order = np.argsort(-scores)
        return _best_per_message(((rows[i][0], rows[i][1], float(scores[i])) for i in order), top_k)

    async def _pg_nearest(
        self, model: str, query: np.ndarray, resource_id: str, thread_id: str | None, top_k: int
    ) -> list[Hit]:
        dims = len(query)
        await self._ensure_index(dims)
        cast = f"embedding::vector({dims})"
        distance = f"{cast} <=> %s::vector({dims})"
        # dims is written into the statement, not bound: the planner uses the partial index only
        # where it can prove the query's WHERE implies the index's `dims = N`.
        where = f"dims = {dims} AND model = %s AND resource_id = %s"
        args: tuple[Any, ...] = (model, resource_id)
        if thread_id is not None:
            where, args = f"{where} AND thread_id = %s", (*args, thread_id)
        # A message's chunks are rows of their own: take a few more than top_k, keep each message once.
        sql = (
            f"SELECT thread_id, message_id, 1 - ({distance}) FROM message_embeddings WHERE {where} "
            f"ORDER BY {distance} LIMIT %s"
        )
        text = "[" + ",".join(repr(float(x)) for x in query) + "]"

        async def search(q: Query) -> list[Any]:
            # An HNSW scan filtered on the resource keeps scanning until it found enough rows
            # (pgvector 0.8's iterative scan), instead of returning fewer than top_k.
            await q("SET LOCAL hnsw.iterative_scan = relaxed_order", ())
            return await q(sql, (text, *args, text, top_k * 3))

        rows = await self.store._transact(search, "searching the stored embeddings")
        ranked = sorted(rows, key=lambda row: -float(row[2]))  # relaxed order: sorted here
        return _best_per_message(((row[0], row[1], float(row[2])) for row in ranked), top_k)

    async def _ensure_index(self, dims: int) -> None:
        """The extension and this dimension's HNSW index, created once (under the migrations'
        advisory lock, so replicas starting together do not race); a server without pgvector is a
        clear error naming it."""
        if dims in self._indexed:
            return
        from procmesh_orchestrator.store.postgres import MIGRATION_LOCK

        index = (
            f"CREATE INDEX IF NOT EXISTS message_embeddings_hnsw_{int(dims)} ON message_embeddings "
            f"USING hnsw ((embedding::vector({int(dims)})) vector_cosine_ops) WHERE dims = {int(dims)}"
        )

        async def ensure(q: Query) -> None:
            await q("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            if not await q("SELECT 1 FROM pg_extension WHERE extname = %s", (EXTENSION,)):
                available = await q("SELECT 1 FROM pg_available_extensions WHERE name = %s", (EXTENSION,))
                if not available:
                    raise MemoryStoreError(
                        f"memory store {self.store.name}: semantic recall needs the PostgreSQL extension "
                        f"{EXTENSION!r} (pgvector), which this server does not have: install pgvector "
                        "on the server, or use a server that has it (docs/configuration.md#semantic-recall)"
                    )
                await q(f"CREATE EXTENSION IF NOT EXISTS {EXTENSION}", ())
            await q("SET LOCAL maintenance_work_mem = '256MB'", ())  # a first build over many rows
            await q(index, ())
            # Fresh statistics, or the planner may take a bulk-loaded table for a few rows and scan
            # the resource's rows instead of the index.
            await q("ANALYZE message_embeddings", ())

        await self.store._transact(ensure, f"creating the pgvector index of {dims} dimensions")
        self._indexed.add(dims)

    async def around(self, resource_id: str, hits: Sequence[Hit], span: Range) -> list[Message]:
        store, p = self.store, self.store.placeholder
        before = check_count(store.name, "messageRange.before", span.before, low=0, high=MAX_RANGE)
        after = check_count(store.name, "messageRange.after", span.after, low=0, high=MAX_RANGE)
        hit_seq = f"(SELECT seq FROM messages WHERE resource_id = {p} AND thread_id = {p} AND id = {p})"
        thread = f"resource_id = {p} AND thread_id = {p}"
        sql = (
            f"SELECT * FROM (SELECT seq, body FROM messages WHERE {thread} AND seq <= {hit_seq} "
            f"ORDER BY seq DESC LIMIT {p}) AS earlier UNION ALL "
            f"SELECT * FROM (SELECT seq, body FROM messages WHERE {thread} AND seq > {hit_seq} "
            f"ORDER BY seq LIMIT {p}) AS later"
        )
        found: dict[tuple[str, int], str] = {}
        for hit in hits:
            key = (resource_id, hit.thread_id)
            args = (*key, *key, hit.message_id, before + 1, *key, *key, hit.message_id, after)
            for seq, body in await store._read(sql, args, "reading recalled messages"):
                found[(hit.thread_id, int(seq))] = body
        return [decode(found[k]) for k in sorted(found)]

    async def add(self, resource_id: str, thread_id: str, embeddings: Sequence[MessageEmbedding]) -> None:
        name = self.store.name
        key = (check_id(name, "resource", resource_id), check_id(name, "thread", thread_id))
        statements = embedding_statements(self.store, key, embeddings)

        async def write(q: Query) -> None:
            for sql, args in statements:
                await q(sql, args)

        await self.store._transact(write, f"storing embeddings of thread {thread_id!r}")


def _best_per_message(ranked: Any, top_k: int) -> list[Hit]:
    hits: dict[tuple[str, str], Hit] = {}
    for thread_id, message_id, score in ranked:
        if (thread_id, message_id) not in hits:
            hits[(thread_id, message_id)] = Hit(thread_id, message_id, score)
            if len(hits) == top_k:
                break
    return list(hits.values())


_INDEXES: weakref.WeakKeyDictionary[Any, StoreRecall] = weakref.WeakKeyDictionary()


def index_of(store: Any) -> RecallIndex:
    """The store's one `StoreRecall` (it remembers which pgvector indexes exist)."""
    if not isinstance(store, StoreHooks):
        kind = type(store).__name__
        raise MemoryStoreError(f"semantic recall needs a SQLite or PostgreSQL store, not {kind}")
    index = _INDEXES.get(store)
    if index is None:
        index = _INDEXES[store] = StoreRecall(store)
    return index
