-- Fencing and rolling deploys for durable runs. `epoch` is the run's fencing token: 1 at creation,
-- one more at every claim; every write of the run (checkpoint, renewal, finish, its memory save,
-- its suspension, its cost reservations) names the epoch its writer holds and is refused when the
-- row's has moved on, so a replica that lost its lease writes nothing, however long it slept.
-- `config_version` is the fingerprint of the agent's configuration on the replica that created the
-- run. `saved_turn` lists the ids of the messages the run's memory save put in its thread (JSON),
-- so a save repeated after a take-over replaces them instead of adding the turn twice. A claim
-- filters on the agent (a replica takes only runs it has the agent for): the index leads with it.
ALTER TABLE durable_runs ADD COLUMN epoch BIGINT NOT NULL DEFAULT 1;
ALTER TABLE durable_runs ADD COLUMN config_version TEXT NOT NULL DEFAULT '';
ALTER TABLE durable_runs ADD COLUMN saved_turn TEXT NOT NULL DEFAULT '[]';
CREATE INDEX durable_runs_by_agent_lease ON durable_runs (status, agent_id, lease_expires_at);
