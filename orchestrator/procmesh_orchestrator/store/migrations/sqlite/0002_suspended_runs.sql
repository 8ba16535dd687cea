-- Runs waiting for tool-call approvals, resumable by any process sharing the file. The snapshot and
-- the awaited tool call ids are JSON text (the store encodes them); a claim moves status from
-- 'suspended' to 'resuming' under the write lock, so only one claim can see 'suspended'.
CREATE TABLE suspended_runs (
    run_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    thread_id TEXT NOT NULL DEFAULT '',
    resource_id TEXT NOT NULL DEFAULT '',
    tool_call_ids TEXT NOT NULL,
    snapshot TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'suspended' CHECK (status IN ('suspended', 'resuming', 'resumed')),
    created_at TEXT NOT NULL
);

CREATE INDEX suspended_runs_by_agent ON suspended_runs (agent_id, created_at DESC, run_id DESC);
