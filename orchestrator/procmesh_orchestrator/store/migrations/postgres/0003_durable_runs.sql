-- Durable runs: checkpointed at every step boundary, held by one replica through a lease it renews.
-- The snapshot is JSON stored as text, as for suspended runs (jsonb refuses \u0000 and lone
-- surrogates). Lease times come from this server's clock (now()), never a replica's. A claim of
-- expired leases selects them FOR UPDATE SKIP LOCKED in lease order (the index below), so two
-- replicas claiming at once take disjoint runs. seq orders the listing newest first.
CREATE TABLE durable_runs (
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    run_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    thread_id TEXT NOT NULL DEFAULT '',
    resource_id TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'done', 'failed', 'cancelled', 'suspended')),
    snapshot TEXT NOT NULL DEFAULT '{}',
    owner TEXT NOT NULL DEFAULT '',
    lease_expires_at TIMESTAMPTZ,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    attempts INTEGER NOT NULL DEFAULT 1,
    error TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX durable_runs_by_lease ON durable_runs (status, lease_expires_at);
CREATE INDEX durable_runs_by_seq ON durable_runs (seq DESC);
