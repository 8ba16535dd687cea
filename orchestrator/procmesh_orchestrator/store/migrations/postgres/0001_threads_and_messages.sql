-- Threads belong to one resource; messages keep their order by an identity sequence and are unique
-- per thread by id, so a retried save replaces in place. Bodies are text, not jsonb: jsonb refuses
-- the \u0000 escape that model output can contain, and nothing queries inside a body.
CREATE TABLE threads (
    id TEXT PRIMARY KEY,
    resource_id TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX threads_by_resource ON threads (resource_id, updated_at DESC, id);

CREATE TABLE messages (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    thread_id TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    role TEXT NOT NULL,
    body TEXT NOT NULL,
    UNIQUE (thread_id, id)
);

CREATE INDEX messages_by_thread ON messages (thread_id, seq);
