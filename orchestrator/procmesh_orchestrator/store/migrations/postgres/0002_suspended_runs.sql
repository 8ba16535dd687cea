-- Runs waiting for tool-call approvals, resumable by any replica. The snapshot and the awaited tool
-- call ids are JSON stored as text, like message bodies: a snapshot holds the run's messages, and
-- jsonb refuses the \u0000 escape (and lone surrogates) that model output can contain. A claim locks
-- the row (SELECT ... FOR UPDATE) before moving status from 'suspended' to 'resuming'.
CREATE TABLE suspended_runs (
    run_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    thread_id TEXT NOT NULL DEFAULT '',
    resource_id TEXT NOT NULL DEFAULT '',
    tool_call_ids TEXT NOT NULL,
    snapshot TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'suspended' CHECK (status IN ('suspended', 'resuming', 'resumed')),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX suspended_runs_by_agent ON suspended_runs (agent_id, created_at DESC, run_id DESC);
