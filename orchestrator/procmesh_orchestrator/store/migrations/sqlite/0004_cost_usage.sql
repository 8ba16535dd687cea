-- Cost control (costControl): what each model call spent, per scope ('resource:<id>',
-- 'thread:<id>', 'agent:<id>', 'global'), in nano-units of the prices' currency (integers, so
-- sums are exact). A call reserves its estimate before it runs and settles to its actual usage
-- after (an unsettled reservation counts at its estimate). An admission reads the scope's sum and
-- inserts its reservation in one BEGIN IMMEDIATE transaction, under the file's write lock, so
-- concurrent admissions (of any process) never both see room for one more. Times are the
-- database's clock as fixed-width ISO 8601 text, whose text order is time order. cost_scopes is
-- the row PostgreSQL locks; here it only keeps the schema the same.
CREATE TABLE cost_scopes (
    scope_key TEXT PRIMARY KEY
);

CREATE TABLE cost_usage (
    id TEXT PRIMARY KEY,
    scope_key TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount >= 0),
    settled INTEGER NOT NULL DEFAULT 0 CHECK (settled IN (0, 1)),
    created_at TEXT NOT NULL
);

CREATE INDEX cost_usage_by_scope ON cost_usage (scope_key, created_at);
