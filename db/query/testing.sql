-- name: AdvanceDueJobs :many
-- Testing only (nothing in a worker, a client or the scheduler runs it).
-- run_jobs(advance=...): the queued jobs of the chosen queues and types
-- (NULL: all of them) whose run_at is still ahead of the database clock
-- but within horizon_seconds of it are made due now, as if that much time
-- had passed: a delayed enqueue, a snooze, a retry's backoff, a durable
-- wait (the deadlines of a moved job's waits within the horizon come to now
-- as well, so a sleep is over and a signal wait times out). The clock is
-- the database's (now()), never the process's. Each job moved gets a
-- "retried" event (as an operator's retry of a queued job writes), with
-- {"via": "run_jobs", "from": "queued", "run_at": <the run_at it
-- had>}; one wake-up per queue, so that a worker waiting for the old run_at
-- claims them at once. Returns the jobs moved, with the run_at they had.
WITH due AS (
    SELECT jobs.id, jobs.run_at FROM jobrun.jobs AS jobs
    WHERE jobs.state = 'queued'
      AND jobs.run_at > now()
      AND jobs.run_at <= now() + make_interval(secs => sqlc.arg(horizon_seconds)::float8)
      AND (sqlc.narg(queues)::text[] IS NULL OR jobs.queue = ANY(sqlc.narg(queues)::text[]))
      AND (sqlc.narg(types)::text[] IS NULL OR jobs.type = ANY(sqlc.narg(types)::text[]))
    ORDER BY jobs.id
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE jobrun.jobs AS jobs SET run_at = now(), updated_at = now()
    FROM due
    WHERE jobs.id = due.id
    RETURNING jobs.id, jobs.queue, jobs.type, jobs.attempts, due.run_at AS was
), waits AS (
    UPDATE jobrun.job_waits AS waits SET until = now()
    FROM moved
    WHERE waits.job_id = moved.id AND waits.until > now()
      AND waits.until <= now() + make_interval(secs => sqlc.arg(horizon_seconds)::float8)
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt, detail)
    SELECT moved.id, 'retried', moved.attempts,
           jsonb_build_object('via', 'run_jobs', 'from', 'queued', 'run_at', moved.was)
    FROM moved
    WHERE sqlc.arg(write_events)::boolean
), wake AS (
    SELECT pg_notify(sqlc.arg(channel)::text, woken.queue)
    FROM (SELECT DISTINCT moved.queue FROM moved) AS woken
    WHERE pg_notification_queue_usage() < sqlc.arg(max_notify_usage)::float8
)
SELECT moved.id, moved.queue, moved.type, moved.was::timestamptz AS was FROM moved
WHERE (SELECT count(*) FROM wake) >= 0;

-- name: HoldBackJobs :many
-- Testing only, like AdvanceDueJobs. run_jobs(types=...): row locks (FOR KEY SHARE) on the queued jobs of the
-- chosen queues whose type is not one of the chosen types, taken in a
-- transaction the caller keeps open while a worker drains those queues.
-- A claim locks FOR UPDATE SKIP LOCKED, so it passes them by: they stay
-- queued, untouched (nothing is written, a rollback lets them go). Run again
-- before each claim, it holds the jobs committed since too. The holding
-- transaction must not be cut by an idle_in_transaction_session_timeout
-- while the handlers run: switched off for it (SET LOCAL).
SELECT jobs.id FROM jobrun.jobs AS jobs
WHERE jobs.state = 'queued'
  AND jobs.queue = ANY(sqlc.arg(queues)::text[])
  AND jobs.type <> ALL(sqlc.arg(types)::text[])
  AND (SELECT set_config('idle_in_transaction_session_timeout', '0', true)) = '0'
ORDER BY jobs.id
FOR KEY SHARE OF jobs;
