-- pgbench replay of OUR claim cycle, statement for statement, on the LIKE step_run table:
-- what LedgerStore.claim + LedgerStore.transition(..., "completed") send over the wire
-- (SQLAlchemy's pool_pre_ping SELECT 1, then BEGIN / statement / COMMIT, twice).
-- tps of this script = cycles/s a C client gets for the same SQL work, which separates
-- "2 transactions and 8 round trips per cycle" from "Python client cost".
-- Each client cycles over its own 1000 keys, like the distinct-key workers of claims.py.
\set k :client_id * 1000 + random(1, 1000)
SELECT 1;
BEGIN;
INSERT INTO pgbench_step_run AS r (
    id, project_id, episode_id, step_id, status, run_id, started_at, created_at, updated_at,
    heartbeat_at, lock_owner, recovery_count, last_recovery_reason
) VALUES (
    gen_random_uuid()::text, 'bench', 'c' || :k, 'step', 'running',
    'pgbench-' || :client_id, now()::text, now()::text, now()::text, now()::text, 'pgbench', 0,
    NULL
)
ON CONFLICT (project_id, episode_id, step_id) DO UPDATE SET
    run_id = excluded.run_id,
    status = 'running',
    started_at = excluded.started_at,
    updated_at = excluded.updated_at,
    heartbeat_at = excluded.heartbeat_at,
    lock_owner = excluded.lock_owner,
    completed_at = NULL,
    error_message = NULL,
    recovery_count = r.recovery_count + 0
WHERE r.status <> 'running'
RETURNING r.run_id;
COMMIT;
SELECT 1;
BEGIN;
UPDATE pgbench_step_run
SET status = 'completed', updated_at = now()::text, error_message = NULL,
    completed_at = now()::text
WHERE project_id = 'bench' AND episode_id = 'c' || :k AND step_id = 'step'
    AND run_id = 'pgbench-' || :client_id;
COMMIT;
