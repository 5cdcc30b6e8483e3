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
-- the rows returned does not exist. The queues of the runnable parents
-- (queued and due) are woken at COMMIT: claims pass them by while this
-- transaction (perhaps the caller's, of any length) holds them.
WITH locked AS (
    SELECT jobs.id FROM jobrun.jobs AS jobs
    WHERE jobs.id = ANY(sqlc.arg(ids)::uuid[])
    ORDER BY jobs.id
    FOR NO KEY UPDATE
), marked AS (
    UPDATE jobrun.jobs AS jobs SET has_dependents = true
    FROM locked WHERE jobs.id = locked.id
    RETURNING jobs.id, jobs.state, jobs.queue, jobs.run_at
), wake AS (
    SELECT pg_notify(sqlc.arg(channel)::text, queued.queue)
    FROM (SELECT DISTINCT marked.queue FROM marked
          WHERE marked.state = 'queued' AND marked.run_at <= clock_timestamp()) AS queued
    WHERE pg_notification_queue_usage() < sqlc.arg(max_notify_usage)::float8
)
SELECT marked.id, marked.state FROM marked WHERE (SELECT count(*) FROM wake) >= 0;

-- name: InsertWorkflow :one
-- No row back: the id is taken (an enqueue retried after its COMMIT reply
-- was lost, or another workflow's id): the store then compares the jobs.
INSERT INTO jobrun.workflows (id, name) VALUES (sqlc.arg(id), sqlc.arg(name))
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: InsertGraphJobs :many
-- A graph's jobs in one statement, parents before children: the roots
-- queued, the others waiting with their count of parents, with their
-- "enqueued" events when write_event, and, for a workflow, their rows of
-- workflow_jobs (migration 0024). Returns what the database decided.
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
), members AS (
    INSERT INTO jobrun.workflow_jobs (workflow_id, job_id)
    SELECT sqlc.narg(workflow_id)::uuid, ins.id FROM ins
    WHERE sqlc.narg(workflow_id)::uuid IS NOT NULL
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

-- Operating workflows (issue 29, item 7): list, get, cancel, retry. A
-- workflow's state is not stored: it is derived from its jobs' states by
-- jobrun.job.workflow.WorkflowState.of, which ListWorkflows' state filter
-- repeats in SQL (running while a job is not finished; then failed if one is
-- dead, cancelled if one is cancelled, else succeeded). Its jobs are read
-- through jobrun.workflow_jobs (migration 0024).

-- name: ListWorkflows :many
-- @nullable finished_at
-- Newest first (created_at, then id: a workflow's id is a UUIDv4, not
-- time-ordered), through workflows_created_idx; before is the last id of
-- the page before (keyset). Each workflow's jobs are counted by state
-- through workflow_jobs' primary key; finished_at is its last job's finish
-- once none can run any more.
SELECT w.id, w.name, w.created_at, c.finished_at,
       c.waiting, c.queued, c.leased, c.succeeded, c.dead, c.cancelled
FROM jobrun.workflows AS w
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE j.state = 'waiting')::int8 AS waiting,
           count(*) FILTER (WHERE j.state = 'queued')::int8 AS queued,
           count(*) FILTER (WHERE j.state = 'leased')::int8 AS leased,
           count(*) FILTER (WHERE j.state = 'succeeded')::int8 AS succeeded,
           count(*) FILTER (WHERE j.state = 'dead')::int8 AS dead,
           count(*) FILTER (WHERE j.state = 'cancelled')::int8 AS cancelled,
           (CASE WHEN bool_and(j.state IN ('succeeded', 'dead', 'cancelled'))
                 THEN max(j.finished_at) END)::timestamptz AS finished_at
    FROM jobrun.workflow_jobs AS m JOIN jobrun.jobs AS j ON j.id = m.job_id
    WHERE m.workflow_id = w.id
) AS c
WHERE (sqlc.narg(name)::text IS NULL OR w.name = sqlc.narg(name)::text)
  AND (sqlc.narg(before)::uuid IS NULL
       OR (w.created_at, w.id) < (SELECT b.created_at, b.id FROM jobrun.workflows AS b
                                  WHERE b.id = sqlc.narg(before)::uuid))
  AND (sqlc.narg(state)::text IS NULL OR sqlc.narg(state)::text =
       CASE WHEN c.waiting + c.queued + c.leased > 0 THEN 'running'
            WHEN c.dead > 0 THEN 'failed'
            WHEN c.cancelled > 0 THEN 'cancelled'
            ELSE 'succeeded' END)
ORDER BY w.created_at DESC, w.id DESC
LIMIT sqlc.arg(max_rows);

-- name: GetWorkflow :one
-- One workflow's row (the store's workflow() and the dashboard's page).
SELECT w.id, w.name, w.created_at FROM jobrun.workflows AS w WHERE w.id = sqlc.arg(id);

-- name: LockWorkflow :one
-- The first statement of a workflow's cancel or retry: two of them on one
-- workflow run one after the other. No row back: there is no such workflow.
SELECT w.id, w.name, w.created_at FROM jobrun.workflows AS w WHERE w.id = sqlc.arg(id)
FOR UPDATE;

-- name: WorkflowNodes :many
-- A workflow's jobs in id order (the order they were enqueued in), without
-- their payloads or results, at most max_rows (NULL: all): the store's
-- workflow() reads them all, the dashboard's page as many as it draws.
SELECT jobs.id, jobs.workflow_node, jobs.type, jobs.queue, jobs.state, jobs.attempts,
       jobs.max_attempts, jobs.created_at, jobs.last_error, jobs.finished_at
FROM jobrun.workflow_jobs AS m
JOIN jobrun.jobs AS jobs ON jobs.id = m.job_id
WHERE m.workflow_id = sqlc.arg(id)
ORDER BY m.job_id
LIMIT sqlc.narg(max_rows)::int8;

-- name: WorkflowEdges :many
-- Every edge whose child is a job of the workflow (the parent may be a job
-- outside it), read through the edges' primary key (child_id first), in
-- (child, parent) order, at most max_rows (NULL: all).
SELECT d.child_id, d.parent_id, d.done
FROM jobrun.workflow_jobs AS m
JOIN jobrun.job_dependencies AS d ON d.child_id = m.job_id
WHERE m.workflow_id = sqlc.arg(id)
ORDER BY d.child_id, d.parent_id
LIMIT sqlc.narg(max_rows)::int8;

-- name: LockWorkflowJobs :many
-- The jobs of a workflow and their parents outside it, locked in id order
-- (as LockJob locks one job): a job of it or a parent finishing meanwhile
-- waits for this transaction, and its trigger then sees the edges as this
-- transaction leaves them. outside marks a parent that is not of the
-- workflow. Claims pass the locked rows by, so the queues of the runnable
-- ones (queued and due) are woken at COMMIT: those of the parents outside it
-- always (they stay queued), those of its own jobs when wake_own (a retry
-- leaves them queued; a cancel ends them).
WITH locked AS (
    SELECT jobs.id, jobs.state, jobs.queue, jobs.attempts, jobs.cancel_requested, jobs.run_at,
           (jobs.workflow_id IS DISTINCT FROM sqlc.arg(id)::uuid)::boolean AS outside
    FROM jobrun.jobs AS jobs
    WHERE jobs.id IN (SELECT m.job_id FROM jobrun.workflow_jobs AS m
                      WHERE m.workflow_id = sqlc.arg(id)::uuid
                      UNION
                      SELECT d.parent_id FROM jobrun.workflow_jobs AS m
                      JOIN jobrun.job_dependencies AS d ON d.child_id = m.job_id
                      WHERE m.workflow_id = sqlc.arg(id)::uuid)
    ORDER BY jobs.id
    FOR UPDATE OF jobs
), wake AS (
    SELECT pg_notify(sqlc.arg(channel)::text, queued.queue)
    FROM (SELECT DISTINCT locked.queue FROM locked
          WHERE locked.state = 'queued' AND locked.run_at <= clock_timestamp()
            AND (locked.outside OR sqlc.arg(wake_own)::boolean)) AS queued
    WHERE pg_notification_queue_usage() < sqlc.arg(max_notify_usage)::float8
)
SELECT locked.id, locked.state, locked.queue, locked.attempts, locked.cancel_requested,
       locked.outside
FROM locked WHERE (SELECT count(*) FROM wake) >= 0
ORDER BY locked.id;

-- name: CancelJobs :many
-- Waiting or queued jobs (locked) cancelled at once, waking the clients
-- waiting for them, as CancelQueuedJob does one. The trigger of migration
-- 0016 runs for each at the end of this statement, when all of them are
-- cancelled already: a workflow's own children are no longer waiting, and
-- only jobs outside it waiting for one of them follow their policy.
WITH cancelled AS (
    UPDATE jobrun.jobs AS jobs SET state = 'cancelled', finished_at = now(), updated_at = now()
    WHERE jobs.id = ANY(sqlc.arg(ids)::uuid[]) AND jobs.state IN ('queued', 'waiting')
    RETURNING jobs.id, jobs.attempts, jobs.notify_finished
), wake AS (
    SELECT pg_notify(sqlc.arg(finish_channel)::text, cancelled.id::text) FROM cancelled
    WHERE cancelled.notify_finished
)
SELECT cancelled.id, cancelled.attempts FROM cancelled WHERE (SELECT count(*) FROM wake) >= 0;

-- name: RequestCancels :many
-- Running jobs (locked) asked to stop, as RequestCancel asks one.
UPDATE jobrun.jobs AS jobs SET cancel_requested = true, updated_at = now()
WHERE jobs.id = ANY(sqlc.arg(ids)::uuid[]) AND jobs.state::text = 'leased' AND NOT jobs.cancel_requested
RETURNING jobs.id, jobs.attempts;

-- name: ReopenEdges :exec
-- A retry's edges put back: each child counts its retried parent again.
UPDATE jobrun.job_dependencies AS d SET done = false
FROM (SELECT unnest(sqlc.arg(child_ids)::uuid[]) AS child_id,
             unnest(sqlc.arg(parent_ids)::uuid[]) AS parent_id) AS e
WHERE d.child_id = e.child_id AND d.parent_id = e.parent_id;

-- name: AddPendingParents :exec
-- Jobs still waiting that wait for a retried parent again.
UPDATE jobrun.jobs AS jobs SET pending_parents = jobs.pending_parents + e.more, updated_at = now()
FROM (SELECT unnest(sqlc.arg(ids)::uuid[]) AS id, unnest(sqlc.arg(more)::int4[]) AS more) AS e
WHERE jobs.id = e.id AND jobs.state = 'waiting';

-- name: RequeueJobs :many
-- A workflow's retry: its dead and cancelled jobs (locked) run again, as
-- RequeueJob runs one (attempts, releases, the cancel flag, the finish and
-- the result cleared; last_error kept until the next attempt), each queued
-- now, or waiting for the parents it counts again (pending).
UPDATE jobrun.jobs AS jobs
SET state = (CASE WHEN e.pending > 0 THEN 'waiting' ELSE 'queued' END)::jobrun.job_state,
    pending_parents = e.pending, run_at = now(), attempts = 0, releases = 0,
    cancel_requested = false, finished_at = NULL, finished_token = NULL, result = NULL,
    notify_finished = false, updated_at = now()
FROM (SELECT unnest(sqlc.arg(ids)::uuid[]) AS id, unnest(sqlc.arg(pending)::int4[]) AS pending) AS e
WHERE jobs.id = e.id AND jobs.state IN ('dead', 'cancelled')
RETURNING jobs.id, jobs.state, jobs.queue, jobs.attempts;
