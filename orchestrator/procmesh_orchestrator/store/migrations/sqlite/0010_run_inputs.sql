-- Recorded inputs for replay (issue 31 item 2), kept only for agents with recordInputs: the run's
-- input, its request context, each step's raw model output (before any processor) and tool
-- results, as JSON, up to the run's size bound. Written in the decision record's transaction,
-- purged with it (retention, and with the run's thread).
CREATE TABLE run_inputs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    thread_id TEXT NOT NULL DEFAULT '',
    resource_id TEXT NOT NULL DEFAULT '',
    kind TEXT NOT NULL,
    step INTEGER NOT NULL,
    body TEXT NOT NULL,
    at TEXT NOT NULL
);

CREATE INDEX run_inputs_by_run ON run_inputs (run_id, id);
CREATE INDEX run_inputs_by_time ON run_inputs (at);
CREATE INDEX run_inputs_by_thread ON run_inputs (resource_id, thread_id);
