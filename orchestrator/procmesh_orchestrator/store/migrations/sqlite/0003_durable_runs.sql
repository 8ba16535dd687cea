-- Durable runs: checkpointed at every step boundary, held by one process through a lease it renews.
-- The snapshot is JSON text. Times are the database's clock as fixed-width ISO 8601 text
-- (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), whose text order is time order; a claim of expired
-- leases reads them in lease order (the index below) under the write lock (BEGIN IMMEDIATE), so
-- two processes claiming at once take disjoint runs. seq orders the listing newest first.
CREATE TABLE durable_runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL UNIQUE,
    agent_id TEXT NOT NULL,
    thread_id TEXT NOT NULL DEFAULT '',
    resource_id TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'done', 'failed', 'cancelled', 'suspended')),
    snapshot TEXT NOT NULL DEFAULT '{}',
    owner TEXT NOT NULL DEFAULT '',
    lease_expires_at TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    attempts INTEGER NOT NULL DEFAULT 1,
    error TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE INDEX durable_runs_by_lease ON durable_runs (status, lease_expires_at);
