-- Cost control (costControl): what each model call spent, per scope ('resource:<id>',
-- 'thread:<id>', 'agent:<id>', 'global'), in nano-units of the prices' currency (integers, so
-- sums are exact). A call reserves its estimate before it runs and settles to its actual usage
-- after (an unsettled reservation counts at its estimate). An admission first locks its scope's
-- row in cost_scopes (FOR UPDATE): concurrent admissions of one scope, from any replica, queue
-- there, and each one's sum sees every reservation committed before it. Times are this server's
-- clock (now()), never a replica's.
CREATE TABLE cost_scopes (
    scope_key TEXT PRIMARY KEY
);

CREATE TABLE cost_usage (
    id TEXT PRIMARY KEY,
    scope_key TEXT NOT NULL,
    amount BIGINT NOT NULL CHECK (amount >= 0),
    settled BOOLEAN NOT NULL DEFAULT FALSE,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX cost_usage_by_scope ON cost_usage (scope_key, created_at);
