-- The decision record (issue 31): every processor decision of a run, written in one transaction
-- at the run's end (or suspension). `seen` is a hash of what the processor was given; `content`
-- is that input itself only when content recording is on. `at` is fixed-width ISO 8601 text
-- (text order is time order): queries by time and the retention's purge read its index.
CREATE TABLE run_decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    thread_id TEXT NOT NULL DEFAULT '',
    resource_id TEXT NOT NULL DEFAULT '',
    processor TEXT NOT NULL,
    sidecar TEXT NOT NULL,
    entry TEXT NOT NULL,
    hook TEXT NOT NULL,
    step INTEGER NOT NULL,
    part INTEGER,
    outcome TEXT NOT NULL,
    would TEXT NOT NULL DEFAULT '',
    latency_ms REAL NOT NULL,
    seen TEXT NOT NULL DEFAULT '',
    content TEXT,
    at TEXT NOT NULL
);

CREATE INDEX run_decisions_by_run ON run_decisions (run_id, id);
CREATE INDEX run_decisions_by_time ON run_decisions (at);
CREATE INDEX run_decisions_by_thread ON run_decisions (resource_id, thread_id);
