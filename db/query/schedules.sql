-- Cron schedules: the Schedules half of the Store.

-- name: InsertSchedule :one
-- Create; no row back means the id is taken.
INSERT INTO jobrun.schedules (id, cron, timezone, queue, type, payload, priority, max_attempts,
                       backoff, next_run_at)
VALUES (sqlc.arg(id), sqlc.arg(cron), sqlc.arg(timezone), sqlc.arg(queue), sqlc.arg(type),
        sqlc.arg(payload), sqlc.arg(priority), sqlc.arg(max_attempts), sqlc.arg(backoff),
        sqlc.arg(next_run_at))
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: UpsertSchedule :one
-- Create or replace. An unchanged cron and time zone keep the stored
-- next_run_at, so an application that upserts its schedules at every start
-- never skips an occurrence that was due but not yet materialised.
INSERT INTO jobrun.schedules AS s (id, cron, timezone, queue, type, payload, priority, max_attempts,
                            backoff, next_run_at)
VALUES (sqlc.arg(id), sqlc.arg(cron), sqlc.arg(timezone), sqlc.arg(queue), sqlc.arg(type),
        sqlc.arg(payload), sqlc.arg(priority), sqlc.arg(max_attempts), sqlc.arg(backoff),
        sqlc.arg(next_run_at))
ON CONFLICT (id) DO UPDATE
SET cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, queue = EXCLUDED.queue,
    type = EXCLUDED.type, payload = EXCLUDED.payload, priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts, backoff = EXCLUDED.backoff,
    next_run_at = CASE WHEN s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone
                       THEN s.next_run_at ELSE EXCLUDED.next_run_at END,
    updated_at = now()
RETURNING *;

-- name: GetSchedule :one
SELECT * FROM jobrun.schedules WHERE id = sqlc.arg(id);

-- name: ListSchedules :many
SELECT * FROM jobrun.schedules ORDER BY id;

-- name: DeleteSchedule :execrows
DELETE FROM jobrun.schedules WHERE id = sqlc.arg(id);

-- name: SetSchedulePaused :one
-- Pause, or resume from the next occurrence after now (occurrences missed
-- while paused are not run).
UPDATE jobrun.schedules
SET paused = sqlc.arg(paused)::boolean,
    next_run_at = COALESCE(sqlc.narg(next_run_at)::timestamptz, next_run_at),
    updated_at = now()
WHERE id = sqlc.arg(id)
RETURNING *;

-- name: DueSchedules :many
-- Defensive against two leaders: rows another leader holds are skipped. The
-- durable guard is the sched:<id>:<next_run> idempotency key of the job
-- (next_run_at as read here, whichever occurrence a misfire runs).
SELECT * FROM jobrun.schedules
WHERE NOT paused AND next_run_at <= sqlc.arg(now)::timestamptz
ORDER BY next_run_at, id
LIMIT sqlc.arg(max_schedules)
FOR UPDATE SKIP LOCKED;

-- name: AdvanceSchedule :execrows
-- Compare-and-set: only the materialiser that saw next_run_at = previous
-- moves it; a second leader that lost the race changes nothing. The move
-- commits with the occurrence's job, so last_fired_at (what the metrics
-- report as the last fire) is the database clock of the materialisation.
UPDATE jobrun.schedules
SET next_run_at = sqlc.arg(next_run_at)::timestamptz, last_fired_at = now(), updated_at = now()
WHERE id = sqlc.arg(id) AND next_run_at = sqlc.arg(previous)::timestamptz;
