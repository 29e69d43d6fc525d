-- pgbench ceiling for a ledger claim: ONE single-row upsert transaction on a table shaped
-- like step_run (created by benchmarks/claims.py as LIKE step_run INCLUDING ALL, so it has
-- the same columns, primary key, UNIQUE(project_id, episode_id, step_id) and indexes).
-- The conflict predicate mirrors the claim's (status <> 'running' OR the steal fence) but is
-- always true, so every transaction writes a row version, like a claim of a settled row.
-- Run with: pgbench -n -M prepared -D keys=<N> -f benchmarks/pgbench_upsert.sql ...
\set k random(1, :keys)
INSERT INTO pgbench_step_run AS r (
    id, project_id, episode_id, step_id, status, run_id, started_at, created_at, updated_at,
    heartbeat_at, lock_owner, recovery_count
) VALUES (
    gen_random_uuid()::text, 'bench', 'e' || :k, 'step', 'running', 'pgbench-' || :client_id,
    now()::text, now()::text, now()::text, now()::text, 'pgbench', 0
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
WHERE r.status <> 'running' OR (r.started_at = r.started_at AND r.run_id IS NOT NULL)
RETURNING r.run_id;
