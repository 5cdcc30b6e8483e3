-- Dependencies and workflows: enqueueing a graph of jobs (migration 0016).
-- The release of a waiting job is the trigger's (jobrun.parent_finished);
-- what a child reads of its parents comes with its claim (ClaimJobs).

-- name: LockParents :many
-- The first statement of an enqueue with parents outside the graph: those
-- parents, locked in id order and marked as having dependents. The lock
-- (FOR NO KEY UPDATE, as the update that finishes a job takes) orders this
-- enqueue against a parent finishing at the same time: either the parent's
-- finish committed first and is read here (its state terminal: the enqueue
-- settles it, SettleFinishedParents), or the finish waits for this
-- transaction and its trigger then sees the new edges. A parent missing from
-- the rows returned does not exist.
WITH locked AS (
    SELECT jobs.id FROM jobrun.jobs AS jobs
    WHERE jobs.id = ANY(sqlc.arg(ids)::uuid[])
    ORDER BY jobs.id
    FOR NO KEY UPDATE
)
UPDATE jobrun.jobs AS jobs SET has_dependents = true
FROM locked WHERE jobs.id = locked.id
RETURNING jobs.id, jobs.state;

-- name: InsertWorkflow :one
-- No row back: the id is taken (an enqueue retried after its COMMIT reply
-- was lost, or another workflow's id): the store then compares the jobs.
INSERT INTO jobrun.workflows (id, name) VALUES (sqlc.arg(id), sqlc.arg(name))
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: InsertGraphJobs :many
-- A graph's jobs in one statement, parents before children: the roots
-- queued, the others waiting with their count of parents, with their
-- "enqueued" events when write_event. Returns what the database decided.
WITH ins AS (
    INSERT INTO jobrun.jobs AS jobs (id, queue, type, payload, priority, max_attempts, backoff,
                      run_at, trace_context, concurrency_key, state, pending_parents,
                      has_dependents, on_parent_failure, workflow_id, workflow_node)
    SELECT unnest(sqlc.arg(ids)::uuid[]), unnest(sqlc.arg(queues)::text[]),
           unnest(sqlc.arg(types)::text[]), unnest(sqlc.arg(payloads)::jsonb[]),
           unnest(sqlc.arg(priorities)::int4[]), unnest(sqlc.arg(max_attempts)::int4[]),
           unnest(sqlc.arg(backoffs)::jsonb[]), unnest(sqlc.arg(run_ats)::timestamptz[]),
           unnest(sqlc.arg(trace_contexts)::jsonb[]), unnest(sqlc.arg(concurrency_keys)::text[]),
           unnest(sqlc.arg(states)::text[])::jobrun.job_state,
           unnest(sqlc.arg(pending)::int4[]), unnest(sqlc.arg(has_dependents)::boolean[]),
           unnest(sqlc.arg(policies)::text[]), sqlc.narg(workflow_id)::uuid,
           unnest(sqlc.arg(nodes)::text[])
    RETURNING jobs.id, jobs.run_at, jobs.created_at, jobs.updated_at
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt)
    SELECT ins.id, 'enqueued', 0 FROM ins WHERE sqlc.arg(write_event)::boolean
)
SELECT ins.id, ins.run_at, ins.created_at, ins.updated_at FROM ins;

-- name: InsertDependencies :exec
INSERT INTO jobrun.job_dependencies (child_id, parent_id)
SELECT unnest(sqlc.arg(child_ids)::uuid[]), unnest(sqlc.arg(parent_ids)::uuid[]);

-- name: SettleFinishedParents :exec
-- Parents that had already finished when their new children were written:
-- each counted with them now, as the trigger counts a parent finishing
-- later (a failed one cancels the children whose policy says so). The
-- wake-ups of the children released go to channel. The children's rows are
-- read afterwards, by another statement: this one's snapshot predates what
-- the function wrote.
SELECT jobrun.parent_finished(jobs.id, jobs.state)
FROM jobrun.jobs AS jobs
WHERE jobs.id = ANY(sqlc.arg(parent_ids)::uuid[])
  AND jobs.state IN ('succeeded', 'dead', 'cancelled')
  AND (SELECT set_config('jobrun_notify.channel', sqlc.arg(channel)::text, true)) IS NOT NULL
ORDER BY jobs.id;
