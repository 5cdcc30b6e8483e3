-- "Why isn't my job running?" (jobrun.postgres.diagnose runs it, nothing
-- else does): what holds a queued job back, read from the database's own
-- state in one statement, by the database clock. Every count is bounded
-- and read through an index (jobs_claim_idx for the jobs ahead,
-- jobs_leased_queue_idx for the leases, queue_starts_queue_at_idx for the
-- rate window), so asking about a job in a queue of a million costs what
-- asking about one in an empty queue costs.

-- name: WhyJob :one
-- The job's own state and when it is due; its queue's pause and limits;
-- the leases that fill the queue's concurrency and its key's (how many, the
-- first few ids); the rate window's use and when the window next lets a job
-- through; how many runnable jobs of its queue come before it in claim
-- order (counted up to ahead_cap); the live workers of the registry serving
-- its queue (the first few) and how many of them know its type (live: seen
-- within their lease TTL, as the type-aware claim reads it); the durable
-- wait a queued job is parked in, if any (migration 0017: its step and the
-- signal it waits for, NULL for a sleep; the latest begun).
WITH j AS (
    SELECT jobs.id, jobs.state, jobs.queue, jobs.type, jobs.priority, jobs.run_at,
           jobs.concurrency_key, jobs.cancel_requested, jobs.lease_owner, jobs.lease_expires_at,
           jobs.pending_parents
    FROM jobrun.jobs AS jobs
    WHERE jobs.id = sqlc.arg(id)::uuid
), window_starts AS (
    SELECT s.at, s.jobs,
           sum(s.jobs) OVER (ORDER BY s.at ROWS UNBOUNDED PRECEDING) AS upto
    FROM j
    JOIN jobrun.queue_limits AS l ON l.queue = j.queue AND l.rate_limit IS NOT NULL
    JOIN jobrun.queue_starts AS s
      ON s.queue = j.queue AND s.at > now() - make_interval(secs => l.rate_period_seconds)
), frees AS (
    -- The window lets a job through again once enough of its oldest starts
    -- have left it: when the rest sum to less than the limit.
    SELECT (min(w.at) + make_interval(secs => max(l.rate_period_seconds)))::timestamptz AS at
    FROM window_starts AS w
    CROSS JOIN (SELECT max(upto) AS total FROM window_starts) AS t
    JOIN j ON true
    JOIN jobrun.queue_limits AS l ON l.queue = j.queue
    WHERE t.total - w.upto < l.rate_limit
)
SELECT j.id, j.state, j.queue, j.type, j.run_at, j.concurrency_key, j.cancel_requested,
       j.lease_owner, j.lease_expires_at,
       now()::timestamptz AS db_now,
       p.paused_at,
       l.concurrency AS concurrency_limit,
       l.per_key AS per_key_limit,
       l.rate_limit,
       l.rate_period_seconds,
       (SELECT count(*) FROM jobrun.jobs AS x
        WHERE x.state = 'leased' AND x.queue = j.queue)::int8 AS leased_in_queue,
       COALESCE((SELECT array_agg(h.id ORDER BY h.id) FROM (
            SELECT x.id FROM jobrun.jobs AS x
            WHERE x.state = 'leased' AND x.queue = j.queue
            ORDER BY x.id LIMIT sqlc.arg(holders)
        ) AS h), '{}')::uuid[] AS queue_holders,
       (SELECT count(*) FROM jobrun.jobs AS x
        WHERE x.state = 'leased' AND x.queue = j.queue
          AND x.concurrency_key = j.concurrency_key)::int8 AS leased_for_key,
       COALESCE((SELECT array_agg(h.id ORDER BY h.id) FROM (
            SELECT x.id FROM jobrun.jobs AS x
            WHERE x.state = 'leased' AND x.queue = j.queue
              AND x.concurrency_key = j.concurrency_key
            ORDER BY x.id LIMIT sqlc.arg(holders)
        ) AS h), '{}')::uuid[] AS key_holders,
       (SELECT COALESCE(sum(w.jobs), 0) FROM window_starts AS w)::int8 AS rate_used,
       frees.at AS rate_frees_at,
       (SELECT count(*) FROM (
            SELECT 1 FROM jobrun.jobs AS x
            WHERE x.state = 'queued' AND x.queue = j.queue AND x.run_at <= now()
              AND (x.priority, x.run_at, x.id) < (j.priority, j.run_at, j.id)
            LIMIT sqlc.arg(ahead_cap)
        ) AS a)::int8 AS ahead,
       COALESCE((SELECT array_agg(w.id ORDER BY w.id) FROM (
            SELECT w.id FROM jobrun.workers AS w
            WHERE j.queue = ANY(w.queues)
              AND w.last_seen_at > now() - make_interval(secs => w.lease_ttl_seconds)
            ORDER BY w.id LIMIT sqlc.arg(holders)
        ) AS w), '{}')::text[] AS serving,
        (SELECT count(*) FROM jobrun.workers AS w
         WHERE j.queue = ANY(w.queues) AND j.type = ANY(w.types)
           AND w.last_seen_at > now() - make_interval(secs => w.lease_ttl_seconds))::int8
         AS knowing,
        j.pending_parents,
        waiting.step AS waiting_step,
        waiting.signal AS waiting_signal
FROM j
LEFT JOIN jobrun.queue_pauses AS p ON p.queue = j.queue
LEFT JOIN jobrun.queue_limits AS l ON l.queue = j.queue
LEFT JOIN frees ON true
LEFT JOIN LATERAL (
    SELECT w.step, w.signal FROM jobrun.job_waits AS w
    WHERE w.job_id = j.id AND j.state = 'queued'
    ORDER BY w.created_at DESC
    LIMIT 1
) AS waiting ON true;
