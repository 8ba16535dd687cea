-- Threads belong to one resource; messages keep their order by an autoincrement sequence (never
-- reused, even after deletes) and are unique per thread by id, so a retried save replaces in place.
-- JSON is stored as text: nothing queries inside it, and both backends then keep the same bytes.
CREATE TABLE threads (
    id TEXT PRIMARY KEY,
    resource_id TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE INDEX threads_by_resource ON threads (resource_id, updated_at DESC);

CREATE TABLE messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    thread_id TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    role TEXT NOT NULL,
    body TEXT NOT NULL,
    UNIQUE (thread_id, id)
);

CREATE INDEX messages_by_thread ON messages (thread_id, seq);
