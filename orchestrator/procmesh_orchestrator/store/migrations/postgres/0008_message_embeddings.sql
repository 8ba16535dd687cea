-- Semantic recall (issue 29): each stored message's embedding, stored with its turn (never
-- re-embedded), one row per chunk of its text. Plain REAL[] so this migration runs on every
-- PostgreSQL; with recall configured the store creates the pgvector extension's HNSW index over
-- `embedding::vector(dims)` (one partial index per dimension) at first use, and searches through it.
CREATE TABLE message_embeddings (
    resource_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    model TEXT NOT NULL,
    chunk INTEGER NOT NULL,
    dims INTEGER NOT NULL,
    embedding REAL[] NOT NULL,
    PRIMARY KEY (resource_id, thread_id, message_id, model, chunk),
    FOREIGN KEY (resource_id, thread_id, message_id) REFERENCES messages (resource_id, thread_id, id)
        ON DELETE CASCADE
);
