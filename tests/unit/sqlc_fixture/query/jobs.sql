-- name: InsertJob :one
-- Returns the whole row: the result reuses the shared Job model.
INSERT INTO jobrun.jobs (id, queue, payload, priority, state, detail)
VALUES (sqlc.arg(id), sqlc.arg(queue), sqlc.arg(payload), sqlc.arg(priority), sqlc.arg(state), sqlc.narg(detail))
RETURNING *;

-- name: GetJob :one
SELECT jobs.* FROM jobrun.jobs WHERE id = sqlc.arg(id);

-- name: ClaimJobs :many
WITH next AS (
    SELECT j.id FROM jobrun.jobs j
    WHERE j.state = 'queued' AND j.queue = ANY(sqlc.arg(queues)::text[])
    ORDER BY j.priority, j.run_at, j.id
    LIMIT sqlc.arg(max_jobs)
    FOR UPDATE SKIP LOCKED
)
UPDATE jobrun.jobs SET state = 'leased', lease_owner = sqlc.arg(owner)
FROM next WHERE jobs.id = next.id
RETURNING jobs.id, jobs.queue, jobs.payload, jobs.state, jobs.lease_owner;

-- name: ListJobIDs :many
SELECT id FROM jobrun.jobs WHERE queue = $1 ORDER BY id;

-- name: CountJobs :one
SELECT count(*) FROM jobrun.jobs;

-- name: GetLeaseOwner :one
SELECT lease_owner FROM jobrun.jobs WHERE id = $1;

-- name: GetState :one
SELECT state FROM jobrun.jobs WHERE id = $1;

-- name: GetPayload :one
SELECT payload FROM jobrun.jobs WHERE id = $1;

-- name: MaxPriority :one
-- An aggregate needs a cast: sqlc types max() as "anyarray".
SELECT max(priority)::int FROM jobrun.jobs WHERE state = sqlc.arg(state);

-- name: JobsInStates :many
-- @deferred
-- The ids and states of the jobs in these states.
SELECT id, state FROM jobrun.jobs WHERE state = ANY(sqlc.arg(states)::jobrun.job_state[]) ORDER BY id;

-- name: SetState :execrows
UPDATE jobrun.jobs SET state = sqlc.arg(new_state) WHERE id = ANY(sqlc.arg(ids)::uuid[]);

-- name: SetDetail :exec
UPDATE jobrun.jobs SET detail = sqlc.narg(detail) WHERE id = sqlc.arg(id);

-- name: DeleteJob :exec
DELETE FROM jobrun.jobs WHERE id = $1;

-- name: Notify :exec
SELECT pg_notify($1, $2);

-- name: NotifyOne :one
SELECT pg_notify(sqlc.arg(channel), sqlc.arg(message));

-- name: JobsWithEvents :many
-- A LEFT JOIN makes jobs.* nullable: not the Job model any more.
SELECT e.id AS event_id, jobs.*
FROM jobrun.job_events e LEFT JOIN jobrun.jobs ON jobs.id = e.job_id
ORDER BY e.id;

-- name: CopyJobs :copyfrom
INSERT INTO jobrun.jobs (id, queue, payload, priority, state, detail) VALUES ($1, $2, $3, $4, $5, $6);

-- name: InsertEvent :batchexec
INSERT INTO jobrun.job_events (job_id, kind, detail) VALUES (sqlc.arg(job_id), sqlc.arg(kind), sqlc.narg(detail));

-- name: AckJob :batchone
UPDATE jobrun.jobs SET state = 'succeeded' WHERE id = sqlc.arg(id) AND state = 'leased'
RETURNING id, state;

-- name: EventKinds :batchmany
SELECT kind FROM jobrun.job_events WHERE job_id = sqlc.arg(job_id) ORDER BY id;

-- name: EventsForJob :batchmany
SELECT * FROM jobrun.job_events WHERE job_id = sqlc.arg(job_id) ORDER BY id;

-- name: InsertEventsUnnest :many
INSERT INTO jobrun.job_events (job_id, kind)
SELECT unnest(sqlc.arg(job_ids)::uuid[]), unnest(sqlc.arg(kinds)::text[])
RETURNING id;

-- name: AddNumbers :one
SELECT $1::int + $2::int AS total, sqlc.arg(class)::text AS class, sqlc.arg(rows)::int AS rows;

-- name: InsertJobWithEvent :one
-- A data-modifying CTE: sqlc names the CTE as the columns' table, and the
-- result is still exactly a jobs row, so it reuses the shared Job model.
WITH ins AS (
    INSERT INTO jobrun.jobs (id, queue, payload, priority, state)
    VALUES (sqlc.arg(id), sqlc.arg(queue), sqlc.arg(payload), sqlc.arg(priority), sqlc.arg(state))
    RETURNING *
)
SELECT * FROM ins;

-- name: SchemaNames :one
-- The schema's name inside a string (or a comment) is data, the same in every
-- schema; the quoted "jobrun" and the upper-case JOBRUN qualifiers are names.
SELECT 'jobrun.jobs'::text AS literal, E'it\'s jobrun.jobs'::text AS escaped,
    $$jobrun.jobs$$::text AS dollar_quoted,
    (SELECT count(*) FROM "jobrun".jobs)::int AS jobs,
    (SELECT count(*) FROM JOBRUN.job_events /* not jobrun.jobs */)::int AS events;
