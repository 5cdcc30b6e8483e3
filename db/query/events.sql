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
-- Up to max_events events older than the age, by their row address, as the
-- BRIN index on `at` finds them (its page ranges in order: roughly the
-- oldest first). job_events has no primary key to walk (migration 0014):
-- every event costs one index entry less. Only the scheduler's leader
-- prunes; a row another transaction deleted meanwhile is simply skipped.
DELETE FROM jobrun.job_events WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM jobrun.job_events
    WHERE at < now() - make_interval(secs => sqlc.arg(age_seconds)::float8)
    LIMIT sqlc.arg(max_events)
));
