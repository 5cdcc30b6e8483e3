-- The job_events audit trail.

-- name: InsertEvents :exec
-- A batch of events in one statement (one unnest per column).
INSERT INTO jobrun.job_events (job_id, kind, attempt, detail)
SELECT unnest(sqlc.arg(job_ids)::uuid[]), unnest(sqlc.arg(kinds)::text[]),
       unnest(sqlc.arg(attempts)::int4[]), unnest(sqlc.arg(details)::jsonb[]);

-- name: CopyEvents :copyfrom
INSERT INTO jobrun.job_events (job_id, kind, attempt) VALUES ($1, $2, $3);

-- name: ListEvents :many
SELECT * FROM jobrun.job_events WHERE job_id = sqlc.arg(job_id) ORDER BY id;

-- name: PruneEvents :execrows
-- Events older than the age, oldest first, at most max_events per call:
-- oldest by id (insertion order, through the primary key), as the BRIN
-- index on `at` has no order to give.
DELETE FROM jobrun.job_events WHERE id IN (
    SELECT id FROM jobrun.job_events
    WHERE at < now() - make_interval(secs => sqlc.arg(age_seconds)::float8)
    ORDER BY id
    LIMIT sqlc.arg(max_events)
);
