-- Working memory (issue 29): one Markdown or JSON text per scope. A resource-scoped memory has
-- thread_id '' (shared by every thread of the resource), a thread-scoped one its thread's id.
-- `version` goes up by one at every write: a writer that read version N writes only where the row
-- is still at N (compare-and-set), so two replicas updating one memory never lose an update.
CREATE TABLE working_memory (
    resource_id TEXT NOT NULL,
    thread_id TEXT NOT NULL DEFAULT '',
    body TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 1,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (resource_id, thread_id)
);
