-- Semantic recall (issue 29): each stored message's embedding, stored with its turn (never
-- re-embedded), one row per chunk of its text, as little-endian float32 bytes. SQLite has no
-- vector index here (this Python's sqlite3 cannot load extensions): recall is an exact search over
-- the resource's (or thread's) rows, found through the primary key; bench/p9_recall.py measures it.
CREATE TABLE message_embeddings (
    resource_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    model TEXT NOT NULL,
    chunk INTEGER NOT NULL,
    dims INTEGER NOT NULL,
    embedding BLOB NOT NULL,
    PRIMARY KEY (resource_id, thread_id, message_id, model, chunk),
    FOREIGN KEY (resource_id, thread_id, message_id) REFERENCES messages (resource_id, thread_id, id)
        ON DELETE CASCADE
);
