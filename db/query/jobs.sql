-- Jobs: enqueue, claim, lease upkeep and the terminal transitions.
-- Every time is the database clock (now()) or "db now as read by the caller".

-- name: EnqueueJob :one
-- One statement, one round trip: the insert, its "enqueued" event (when
-- write_event) and the wake-up. Postgres delivers the NOTIFY only at commit,
-- so no worker can wake before the row is visible; a replay (the client's id
-- already stored: a retry after a lost COMMIT reply) inserts nothing, writes
-- no event and notifies nobody. The conflict target is the primary key only:
-- any other unique violation is an error, never a silent replay. Jobs with an
-- idempotency key go through EnqueueKeyedJob.
--
-- The wake-up is an optimisation and the row is the truth: when the server's
-- notification queue is at least max_notify_usage full (a session LISTENing
-- while idle in a long transaction keeps it from draining, and a full queue
-- fails every COMMIT that notifies), no notification is sent and workers
-- find the job by polling. notify_queue_usage tells the caller the queue's
-- usage.
--
-- Every new job is announced, a delayed one too (the spec: one notification
-- per enqueue). The payload of a job due now is its queue's name; a delayed
-- job's is <queue>@<milliseconds until run_at>, by the database clock at
-- this statement and rounded up, so that a worker can wake when the job is
-- due (never before: the delay is counted from a moment before the COMMIT
-- that delivers it). A worker of an older version ignores such a payload,
-- as it ignores anything that is not a queue name, and polls as before.
-- trace_context is the job's creation
-- context (the enqueueing span's W3C carrier; NULL when tracing is off).
--
-- It returns only what the database decided (run_at from the delay by its
-- clock, created_at and updated_at): every other column of a new job is the
-- client's value or a column default, and the store fills them in
-- (jobrun.postgres.convert.job_from_insert). Reading back and decoding all
-- of the row's 28 columns, payload and backoff parsed again, cost a third of
-- an enqueue's client time.
WITH ins AS (
    INSERT INTO jobrun.jobs AS jobs (id, queue, type, payload, priority, max_attempts, backoff, run_at,
                      idempotency_key, trace_context, concurrency_key)
    VALUES (sqlc.arg(id), sqlc.arg(queue), sqlc.arg(type), sqlc.arg(payload),
            sqlc.arg(priority), sqlc.arg(max_attempts), sqlc.arg(backoff),
            COALESCE(sqlc.narg(run_at)::timestamptz,
                     now() + make_interval(secs => sqlc.arg(delay_seconds)::float8)),
            NULL, sqlc.narg(trace_context)::jsonb, sqlc.narg(concurrency_key)::text)
    ON CONFLICT (id) DO NOTHING
    RETURNING jobs.id, jobs.queue, jobs.run_at, jobs.created_at, jobs.updated_at
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt)
    SELECT ins.id, 'enqueued', 0 FROM ins WHERE sqlc.arg(write_event)::boolean
), wake_to AS (
    SELECT sqlc.arg(channel)::text AS channel, sqlc.arg(max_notify_usage)::float8 AS room
)
SELECT ins.id, ins.run_at, ins.created_at, ins.updated_at,
       usage.used::float8 AS notify_queue_usage,
       -- The wake-up, sent by this row (CASE evaluates pg_notify only when
       -- the queue has room): no CTE of its own to count, which cost about
       -- 16 us of server time per enqueue (PostgreSQL 15, pgbench).
       (CASE WHEN usage.used < wake_to.room
             THEN pg_notify(wake_to.channel,
                            CASE WHEN usage.delay_ms > 0 THEN ins.queue || '@' || usage.delay_ms
                                 ELSE ins.queue END)::text IS NOT NULL
             ELSE false END)::boolean AS notified
FROM ins
CROSS JOIN wake_to
CROSS JOIN LATERAL (
    SELECT pg_notification_queue_usage() AS used,
           ceil(1000 * extract(epoch FROM ins.run_at - clock_timestamp()))::int8 AS delay_ms
) AS usage;

-- name: EnqueueKeyedJob :one
-- EnqueueJob for a job with an idempotency key: the conflict target is
-- jobs_idem_uniq, so a replay of the key (a retry after a lost COMMIT reply
-- included) inserts nothing. The client's id taken by another job is a
-- unique violation of jobs_pkey, which the store reports as AlreadyExists.
WITH ins AS (
    INSERT INTO jobrun.jobs AS jobs (id, queue, type, payload, priority, max_attempts, backoff, run_at,
                      idempotency_key, trace_context, concurrency_key)
    VALUES (sqlc.arg(id), sqlc.arg(queue), sqlc.arg(type), sqlc.arg(payload),
            sqlc.arg(priority), sqlc.arg(max_attempts), sqlc.arg(backoff),
            COALESCE(sqlc.narg(run_at)::timestamptz,
                     now() + make_interval(secs => sqlc.arg(delay_seconds)::float8)),
            sqlc.arg(idempotency_key)::text, sqlc.narg(trace_context)::jsonb,
            sqlc.narg(concurrency_key)::text)
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING jobs.id, jobs.queue, jobs.run_at, jobs.created_at, jobs.updated_at
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt)
    SELECT ins.id, 'enqueued', 0 FROM ins WHERE sqlc.arg(write_event)::boolean
), wake_to AS (
    SELECT sqlc.arg(channel)::text AS channel, sqlc.arg(max_notify_usage)::float8 AS room
)
SELECT ins.id, ins.run_at, ins.created_at, ins.updated_at,
       usage.used::float8 AS notify_queue_usage,
       -- The wake-up, sent by this row (CASE evaluates pg_notify only when
       -- the queue has room): no CTE of its own to count, which cost about
       -- 16 us of server time per enqueue (PostgreSQL 15, pgbench).
       (CASE WHEN usage.used < wake_to.room
             THEN pg_notify(wake_to.channel,
                            CASE WHEN usage.delay_ms > 0 THEN ins.queue || '@' || usage.delay_ms
                                 ELSE ins.queue END)::text IS NOT NULL
             ELSE false END)::boolean AS notified
FROM ins
CROSS JOIN wake_to
CROSS JOIN LATERAL (
    SELECT pg_notification_queue_usage() AS used,
           ceil(1000 * extract(epoch FROM ins.run_at - clock_timestamp()))::int8 AS delay_ms
) AS usage;

-- name: SamePayloads :many
-- Of the stored jobs given, those whose payload equals the one sent, compared
-- as jsonb (the way PostgreSQL compares them: 1 and 1.0 are one number, key
-- order does not matter). An idempotent replay compares here, never in
-- Python: a float like 1e20 comes back from jsonb as an int, and -0.0 as 0.
SELECT jobs.id FROM jobrun.jobs AS jobs
JOIN (SELECT unnest(sqlc.arg(ids)::uuid[]) AS id,
             unnest(sqlc.arg(payloads)::jsonb[]) AS payload) AS sent
  ON jobs.id = sent.id
WHERE jobs.payload = sent.payload;

-- name: GetJobByKey :one
SELECT * FROM jobrun.jobs AS jobs WHERE queue = sqlc.arg(queue) AND idempotency_key = sqlc.arg(idempotency_key);

-- name: GetJobsByKeys :many
SELECT jobs.* FROM jobrun.jobs AS jobs
JOIN (SELECT unnest(sqlc.arg(queues)::text[]) AS queue,
             unnest(sqlc.arg(idempotency_keys)::text[]) AS idempotency_key) AS k
  ON jobs.queue = k.queue AND jobs.idempotency_key = k.idempotency_key;

-- name: InsertKeyedJobs :many
-- The keyed part of a batch, in (queue, key) order so that two batches with
-- overlapping keys take the unique-index locks in the same order (no
-- deadlock). Returns the ids actually inserted; the others are replays or
-- conflicts, which the store tells apart by comparing bodies. The conflict
-- target is jobs_idem_uniq only: an id taken by another job is a unique
-- violation of jobs_pkey (AlreadyExists), and any other unique index a
-- future migration adds can never be swallowed as a replay.
INSERT INTO jobrun.jobs AS jobs (id, queue, type, payload, priority, max_attempts, backoff, run_at,
                  idempotency_key, trace_context, concurrency_key)
SELECT unnest(sqlc.arg(ids)::uuid[]), unnest(sqlc.arg(queues)::text[]),
       unnest(sqlc.arg(types)::text[]), unnest(sqlc.arg(payloads)::jsonb[]),
       unnest(sqlc.arg(priorities)::int4[]), unnest(sqlc.arg(max_attempts)::int4[]),
       unnest(sqlc.arg(backoffs)::jsonb[]), unnest(sqlc.arg(run_ats)::timestamptz[]),
       unnest(sqlc.arg(idempotency_keys)::text[]), unnest(sqlc.arg(trace_contexts)::jsonb[]),
       unnest(sqlc.arg(concurrency_keys)::text[])
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: GetJobsByIds :many
SELECT * FROM jobrun.jobs AS jobs WHERE id = ANY(sqlc.arg(ids)::uuid[]);

-- name: CopyJobs :copyfrom
INSERT INTO jobrun.jobs (id, queue, type, payload, priority, max_attempts, backoff, run_at,
                         trace_context, concurrency_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: ClaimJobs :many
-- @deferred
-- @nullable parent_results dependents_pending
-- One statement claims up to max_jobs: queued -> leased, a fresh lease
-- token (the fence) per claim, the progress of an earlier attempt cleared,
-- and the "claimed" events when write_events. The first start of them (in
-- claim order) start at once: their attempt is burned and started_at set;
-- the others wait for a thread, their attempt uncounted until StartJobs
-- starts them (a process that dies first burns none of theirs: see
-- migration 0010); their events say {"started": false}. Each queue is
-- read on its own through jobs_claim_idx in (priority, run_at, id) order (a
-- LATERAL per queue: an index scan that stops after max_jobs rows, where
-- "queue = ANY(...)" would sort every queued row), then the best max_jobs of
-- them are taken, and returned in that order. LIMIT inside a FOR UPDATE
-- SKIP LOCKED subquery, never IN (subquery), so a claim can never return
-- more than max_jobs rows. Type-aware (issue 28): a registered worker (a
-- row in jobrun.workers for owner) takes only the types it knows, and a
-- type no live worker serving the queue knows (a rollout, a forgotten
-- handler), which it then releases; an owner with no row (a bare store
-- call, run_jobs) takes every type. Paused queues are skipped, and so are limited
-- queues (a row in queue_limits): only ClaimLimitedJobs, after the queue's
-- lock, claims those. This statement is the lock-free path of every queue
-- without limits. Its body is the function jobrun.claim_jobs (migration
-- 0021), which PL/pgSQL plans once per session with a generic plan kept on
-- the index; planned afresh on every call, as it was before, the claim
-- spent as much server time planning as executing. In a worker's round that
-- named its claim (jobrun_continue.to, migration 0025) it first returns the
-- children the round's release leased to it (a continuation lease), counted
-- in max_jobs and start.
--
-- The claim commits asynchronously (synchronous_commit off for this
-- transaction only): if the server crashes before the claim reaches disk, the
-- job simply was never claimed and runs again (at-least-once); a completion
-- commits synchronously and flushes the WAL up to it, claim included, so no
-- durable completion can rest on a lost claim, and the effect ledger still
-- keeps the transactional path exactly-once. A named claim keeps the
-- session's setting instead: its round completes jobs in the same
-- transaction.
SELECT c.*,
       -- A job with parents (on_parent_failure set, migration 0016) gets
       -- their outcomes, read through the edges' primary key; a plain job
       -- pays this CASE only. As JSON text, built as text (json_agg, not
       -- jsonb's binary form): the worker decodes it only if the handler
       -- reads it (ParentResults.decoded_later).
       CASE WHEN c.on_parent_failure IS NOT NULL THEN (
           SELECT json_agg(json_build_object('id', p.id, 'type', p.type, 'node', p.workflow_node,
                                             'state', p.state, 'result', p.result,
                                             'error', p.last_error) ORDER BY p.id)
           FROM jobrun.job_dependencies AS d JOIN jobrun.jobs AS p ON p.id = d.parent_id
           WHERE d.child_id = c.id) END::text AS parent_results,
       -- A job others wait for gets the fewest parents one of them still
       -- waits for (1: its finish releases that one), read through the
       -- edges' parent index: the worker records its success at once when
       -- it releases a dependent soon, in a batch when it is one of many.
       CASE WHEN c.has_dependents THEN (
           SELECT min(w.pending_parents)
           FROM jobrun.job_dependencies AS d JOIN jobrun.jobs AS w ON w.id = d.child_id
           WHERE d.parent_id = c.id AND NOT d.done AND w.state = 'waiting') END::int4
           AS dependents_pending
FROM jobrun.claim_jobs(sqlc.arg(queues)::text[], sqlc.arg(owner)::text, sqlc.arg(max_jobs)::int8,
                       sqlc.arg(start)::int8, sqlc.arg(ttl_seconds)::float8,
                       sqlc.arg(write_events)::boolean) AS c
ORDER BY c.priority, c.run_at, c.id;

-- name: ClaimLimitedJobs :many
-- @deferred
-- @nullable parent_results dependents_pending
-- ClaimJobs (its start included) for a claim that includes limited queues,
-- as the second statement of a transaction whose first was LockQueueLimits.
-- The limited queues' rows are locked and named in jobrun.claim_locks: this
-- statement's snapshot is newer than every claim of those queues that
-- committed before, so its counts are exact; a limited queue it sees but
-- did not lock (its limits were set after the lock was taken) yields
-- nothing. Queues without limits are claimed as in ClaimJobs. The store
-- runs it with a generic plan (plan_cache_mode, for this transaction): a
-- fresh plan of this statement costs more than running it.
--
-- A limited queue's room is the least of max_jobs, concurrency less its
-- leased jobs, and rate_limit less the jobs started in the window (the
-- claims' own rows in queue_starts, at statement_timestamp(): the database
-- clock after the lock was granted). With per_key, keys whose leased jobs
-- reach the limit are skipped in the scan itself (a busy key never blocks
-- the keys behind it); the first rows of the other keys are read without
-- locks (the queue's row lock keeps other claimers out), each key held to
-- its room, the queue to its room, and only those rows locked and claimed.
-- The claim commits asynchronously, as in ClaimJobs, unless
-- commit_async is false: a transaction that also completes jobs
-- (complete_and_claim) keeps the session's synchronous_commit, so that the
-- completions are durable once COMMIT answers.
WITH lim AS MATERIALIZED (
    SELECT q.name, l.concurrency, l.per_key, l.rate_limit, l.rate_period_seconds,
           l.queue IS NOT NULL AS limited,
           COALESCE(l.queue = ANY(COALESCE(NULLIF(current_setting('jobrun.claim_locks', true), ''),
                                           '{}')::text[]), false) AS locked
    FROM unnest(sqlc.arg(queues)::text[]) AS q(name)
    LEFT JOIN jobrun.queue_limits AS l ON l.queue = q.name
    WHERE NOT EXISTS (SELECT 1 FROM jobrun.queue_pauses p WHERE p.queue = q.name)
      AND (SELECT set_config('synchronous_commit',
                             CASE WHEN sqlc.arg(commit_async)::boolean THEN 'off'
                                  ELSE current_setting('synchronous_commit') END,
                             true)) IS NOT NULL
), room AS MATERIALIZED (
    SELECT lim.name, lim.per_key, lim.locked AND lim.rate_limit IS NOT NULL AS rated,
           CASE WHEN NOT lim.limited THEN sqlc.arg(max_jobs)::int4
                WHEN NOT lim.locked THEN 0
                ELSE GREATEST(0, LEAST(
                    sqlc.arg(max_jobs)::int4,
                    COALESCE(lim.concurrency - (
                        SELECT count(*) FROM jobrun.jobs AS j
                        WHERE j.state = 'leased' AND j.queue = lim.name)::int4,
                        sqlc.arg(max_jobs)::int4),
                    COALESCE(lim.rate_limit - (
                        SELECT COALESCE(sum(s.jobs), 0) FROM jobrun.queue_starts AS s
                        WHERE s.queue = lim.name
                          AND s.at > statement_timestamp()
                                     - make_interval(secs => lim.rate_period_seconds))::int4,
                        sqlc.arg(max_jobs)::int4)))
           END AS n
    FROM lim
), busy AS MATERIALIZED (
    SELECT j.queue, j.concurrency_key AS key, count(*)::int4 AS leased
    FROM room JOIN jobrun.jobs AS j
      ON j.state = 'leased' AND j.queue = room.name AND j.concurrency_key IS NOT NULL
    WHERE room.per_key IS NOT NULL AND room.n > 0
    GROUP BY j.queue, j.concurrency_key
), full_keys AS MATERIALIZED (
    SELECT room.name, COALESCE(array_agg(busy.key) FILTER (WHERE busy.key IS NOT NULL),
                               '{}')::text[] AS keys
    FROM room LEFT JOIN busy ON busy.queue = room.name AND busy.leased >= room.per_key
    WHERE room.per_key IS NOT NULL AND room.n > 0
    GROUP BY room.name
), plain AS (
    SELECT c.id, c.priority, c.run_at
    FROM room CROSS JOIN LATERAL (
        SELECT jobs.id, jobs.priority, jobs.run_at FROM jobrun.jobs AS jobs
        WHERE jobs.state = 'queued' AND jobs.queue = room.name AND jobs.run_at <= now()
          AND (COALESCE(jobs.type = ANY((SELECT w.types FROM jobrun.workers AS w
                                         WHERE w.id = sqlc.arg(owner)::text)::text[]), true)
               OR NOT EXISTS (SELECT 1 FROM jobrun.workers AS w
                              WHERE jobs.type = ANY(w.types) AND jobs.queue = ANY(w.queues)
                                AND w.last_seen_at
                                    > now() - make_interval(secs => w.lease_ttl_seconds)))
        ORDER BY jobs.priority, jobs.run_at, jobs.id
        LIMIT room.n
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE room.per_key IS NULL AND room.n > 0
), seen AS (
    SELECT c.id, c.priority, c.run_at, c.concurrency_key, room.name, room.n, room.per_key,
           row_number() OVER (PARTITION BY room.name, c.concurrency_key
                              ORDER BY c.priority, c.run_at, c.id) AS nth_of_key
    FROM room JOIN full_keys ON full_keys.name = room.name CROSS JOIN LATERAL (
        SELECT jobs.id, jobs.priority, jobs.run_at, jobs.concurrency_key
        FROM jobrun.jobs AS jobs
        WHERE jobs.state = 'queued' AND jobs.queue = room.name AND jobs.run_at <= now()
          AND (jobs.concurrency_key IS NULL OR jobs.concurrency_key <> ALL(full_keys.keys))
          AND (COALESCE(jobs.type = ANY((SELECT w.types FROM jobrun.workers AS w
                                         WHERE w.id = sqlc.arg(owner)::text)::text[]), true)
               OR NOT EXISTS (SELECT 1 FROM jobrun.workers AS w
                              WHERE jobs.type = ANY(w.types) AND jobs.queue = ANY(w.queues)
                                AND w.last_seen_at
                                    > now() - make_interval(secs => w.lease_ttl_seconds)))
        ORDER BY jobs.priority, jobs.run_at, jobs.id
        LIMIT room.n * 4
    ) AS c
), fits AS (
    SELECT seen.id, seen.n,
           row_number() OVER (PARTITION BY seen.name
                              ORDER BY seen.priority, seen.run_at, seen.id) AS nth_of_queue
    FROM seen LEFT JOIN busy ON busy.queue = seen.name AND busy.key = seen.concurrency_key
    WHERE seen.concurrency_key IS NULL
       OR seen.nth_of_key <= seen.per_key - COALESCE(busy.leased, 0)
), keyed AS (
    SELECT jobs.id, jobs.priority, jobs.run_at FROM jobrun.jobs AS jobs
    WHERE jobs.id = ANY(ARRAY(SELECT fits.id FROM fits WHERE fits.nth_of_queue <= fits.n))
      AND jobs.state = 'queued'
    FOR UPDATE SKIP LOCKED
), next AS (
    SELECT u.id, row_number() OVER (ORDER BY u.priority, u.run_at, u.id) AS nth FROM (
        SELECT plain.id, plain.priority, plain.run_at FROM plain
        UNION ALL
        SELECT keyed.id, keyed.priority, keyed.run_at FROM keyed
    ) AS u
    ORDER BY u.priority, u.run_at, u.id
    LIMIT sqlc.arg(max_jobs)
), claimed AS (
    UPDATE jobrun.jobs AS jobs
    SET state = 'leased',
        attempts = jobs.attempts + (next.nth <= sqlc.arg(start)::int8)::int4,
        started_at = CASE WHEN next.nth <= sqlc.arg(start)::int8 THEN now() END,
        lease_owner = sqlc.arg(owner)::text,
        lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(secs => sqlc.arg(ttl_seconds)::float8),
        progress = NULL, progress_message = NULL, progress_at = NULL,
        updated_at = now()
    FROM next
    WHERE jobs.id = next.id
    RETURNING jobs.*
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt, at, detail)
    SELECT claimed.id, 'claimed', claimed.attempts, statement_timestamp(),
           CASE WHEN claimed.started_at IS NULL THEN '{"started": false}'::jsonb END
    FROM claimed
    WHERE sqlc.arg(write_events)::boolean
), started AS (
    INSERT INTO jobrun.queue_starts (queue, at, jobs)
    SELECT claimed.queue, statement_timestamp(), count(*)::int4
    FROM claimed JOIN room ON room.name = claimed.queue AND room.rated
    GROUP BY claimed.queue
), forgotten AS (
    DELETE FROM jobrun.queue_starts AS s USING lim
    WHERE s.queue = lim.name AND lim.locked AND lim.rate_limit IS NOT NULL
      AND s.at <= statement_timestamp() - make_interval(secs => lim.rate_period_seconds)
)
SELECT claimed.*,
       -- A job with parents (on_parent_failure set, migration 0016) gets
       -- their outcomes, read through the edges' primary key; a plain job
       -- pays this CASE only. As JSON text, built as text (json_agg, not
       -- jsonb's binary form): the worker decodes it only if the handler
       -- reads it (ParentResults.decoded_later).
       CASE WHEN claimed.on_parent_failure IS NOT NULL THEN (
           SELECT json_agg(json_build_object('id', p.id, 'type', p.type, 'node', p.workflow_node,
                                             'state', p.state, 'result', p.result,
                                             'error', p.last_error) ORDER BY p.id)
           FROM jobrun.job_dependencies AS d JOIN jobrun.jobs AS p ON p.id = d.parent_id
           WHERE d.child_id = claimed.id) END::text AS parent_results,
       -- As in ClaimJobs: the fewest parents a job waiting for it still waits for.
       CASE WHEN claimed.has_dependents THEN (
           SELECT min(w.pending_parents)
           FROM jobrun.job_dependencies AS d JOIN jobrun.jobs AS w ON w.id = d.child_id
           WHERE d.parent_id = claimed.id AND NOT d.done AND w.state = 'waiting') END::int4
           AS dependents_pending
FROM claimed ORDER BY claimed.priority, claimed.run_at, claimed.id;

-- name: LockQueueLimits :exec
-- The first statement of a limited claim: lock the limits rows of the
-- queues about to be claimed (in queue order: no deadlock between claims of
-- overlapping queue lists), and name them in jobrun.claim_locks for this
-- transaction, so that ClaimJobs, the next statement, counts with a
-- snapshot taken after every earlier claim of those queues committed.
SELECT set_config('jobrun.claim_locks', COALESCE(array_agg(l.queue)::text, '{}'), true)
FROM (
    SELECT queue FROM jobrun.queue_limits
    WHERE queue = ANY(sqlc.arg(queues)::text[])
    ORDER BY queue
    FOR UPDATE
) AS l;

-- name: LimitedQueues :many
-- Which of the queues have limits (the store routes their claims through
-- LockQueueLimits), with each one's global concurrency (NULL: none): a
-- worker that alone holds that many leases of a queue knows, without a
-- claim, that a claim of it would get nothing. frees_slots: a job that
-- finishes frees a slot of a limit (concurrency or per key), where a rate
-- limit counts starts and a completion frees nothing of it.
SELECT queue, concurrency, (concurrency IS NOT NULL OR per_key IS NOT NULL) AS frees_slots
FROM jobrun.queue_limits
WHERE queue = ANY(sqlc.arg(queues)::text[]) ORDER BY queue;

-- name: LimitsHoldBack :one
-- After a short claim: does a limit hold back ready jobs of these queues,
-- and for how long? NULL: no limited queue among them has ready jobs (the
-- claim was short for want of work). Otherwise the seconds until a claim
-- may get some: for a queue whose rate window is full, until its oldest
-- start leaves the window; 0 when nobody can tell (a slot frees when a job
-- finishes). The least over the queues. (A freed slot or an aging window
-- sends no wake-up, so the worker comes back by itself.)
SELECT min(CASE WHEN l.rate_limit IS NOT NULL AND w.started >= l.rate_limit
                THEN GREATEST(extract(epoch FROM w.oldest
                                      + make_interval(secs => l.rate_period_seconds)
                                      - statement_timestamp()), 0)
                ELSE 0 END)::float8 AS wait_seconds
FROM jobrun.queue_limits AS l
CROSS JOIN LATERAL (
    SELECT COALESCE(sum(s.jobs), 0) AS started, min(s.at) AS oldest
    FROM jobrun.queue_starts AS s
    WHERE s.queue = l.queue AND l.rate_limit IS NOT NULL
      AND s.at > statement_timestamp() - make_interval(secs => l.rate_period_seconds)
) AS w
WHERE l.queue = ANY(sqlc.arg(queues)::text[])
  AND NOT EXISTS (SELECT 1 FROM jobrun.queue_pauses p WHERE p.queue = l.queue)
  AND EXISTS (SELECT 1 FROM jobrun.jobs AS jobs
              WHERE jobs.state = 'queued' AND jobs.queue = l.queue AND jobs.run_at <= now());

-- name: SetQueueLimits :one
-- Replace a queue's limits (every one: NULL removes that limit). Waits for
-- a claim of the queue in flight (it holds the row) and wakes the workers
-- of the queue, since a raised limit frees room.
WITH up AS (
    INSERT INTO jobrun.queue_limits AS l (queue, concurrency, per_key, rate_limit, rate_period_seconds)
    VALUES (sqlc.arg(queue), sqlc.narg(concurrency)::int4, sqlc.narg(per_key)::int4,
            sqlc.narg(rate_limit)::int4, sqlc.narg(rate_period_seconds)::float8)
    ON CONFLICT (queue) DO UPDATE
    SET concurrency = EXCLUDED.concurrency, per_key = EXCLUDED.per_key,
        rate_limit = EXCLUDED.rate_limit, rate_period_seconds = EXCLUDED.rate_period_seconds,
        updated_at = now()
    RETURNING l.*
), wake AS (
    SELECT pg_notify(sqlc.arg(channel)::text, up.queue) FROM up
    WHERE pg_notification_queue_usage() < sqlc.arg(max_notify_usage)::float8
)
SELECT up.* FROM up WHERE (SELECT count(*) FROM wake) >= 0;

-- name: ChangeQueueLimits :one
-- Set the limits given and keep the others (keep_*), in one statement: two
-- operators changing different limits of one queue at once both land. The
-- caller sets at least one limit (a row of only NULLs is refused by the
-- table's check). Wakes the queue's workers, like SetQueueLimits.
WITH up AS (
    INSERT INTO jobrun.queue_limits AS l (queue, concurrency, per_key, rate_limit, rate_period_seconds)
    VALUES (sqlc.arg(queue), sqlc.narg(concurrency)::int4, sqlc.narg(per_key)::int4,
            sqlc.narg(rate_limit)::int4, sqlc.narg(rate_period_seconds)::float8)
    ON CONFLICT (queue) DO UPDATE
    SET concurrency = CASE WHEN sqlc.arg(keep_concurrency)::boolean THEN l.concurrency
                           ELSE EXCLUDED.concurrency END,
        per_key = CASE WHEN sqlc.arg(keep_per_key)::boolean THEN l.per_key ELSE EXCLUDED.per_key END,
        rate_limit = CASE WHEN sqlc.arg(keep_rate)::boolean THEN l.rate_limit
                          ELSE EXCLUDED.rate_limit END,
        rate_period_seconds = CASE WHEN sqlc.arg(keep_rate)::boolean THEN l.rate_period_seconds
                                   ELSE EXCLUDED.rate_period_seconds END,
        updated_at = now()
    RETURNING l.*
), wake AS (
    SELECT pg_notify(sqlc.arg(channel)::text, up.queue) FROM up
    WHERE pg_notification_queue_usage() < sqlc.arg(max_notify_usage)::float8
)
SELECT up.* FROM up WHERE (SELECT count(*) FROM wake) >= 0;

-- name: LockQueueLimitsRow :one
-- A queue's limits, locked until the transaction ends (a change that only
-- removes limits reads, then rewrites or deletes, the row it holds).
SELECT * FROM jobrun.queue_limits AS l WHERE l.queue = sqlc.arg(queue) FOR UPDATE;

-- name: DeleteQueueLimits :one
-- Lift every limit of a queue (and forget its rate window); wakes its
-- workers. removed is 0 when the queue had no limits.
WITH gone AS (
    DELETE FROM jobrun.queue_limits AS l WHERE l.queue = sqlc.arg(queue) RETURNING l.queue
), window_gone AS (
    DELETE FROM jobrun.queue_starts AS s USING gone WHERE s.queue = gone.queue
), wake AS (
    SELECT pg_notify(sqlc.arg(channel)::text, gone.queue) FROM gone
    WHERE pg_notification_queue_usage() < sqlc.arg(max_notify_usage)::float8
)
SELECT count(*)::int8 AS removed FROM gone WHERE (SELECT count(*) FROM wake) >= 0;

-- name: ListQueueLimits :many
-- Every queue's limits, with what they hold now: leased jobs and the jobs
-- started in the current rate window.
SELECT l.queue, l.concurrency, l.per_key, l.rate_limit, l.rate_period_seconds, l.updated_at,
       (SELECT count(*) FROM jobrun.jobs AS j WHERE j.state = 'leased' AND j.queue = l.queue)::int8 AS leased,
       (SELECT COALESCE(sum(s.jobs), 0) FROM jobrun.queue_starts AS s
        WHERE s.queue = l.queue AND l.rate_limit IS NOT NULL
          AND s.at > now() - make_interval(secs => l.rate_period_seconds))::int8 AS started_in_window
FROM jobrun.queue_limits AS l
ORDER BY l.queue;

-- name: RecordProgress :one
-- A running handler's progress, owner- and token-guarded like a heartbeat.
-- No row back: the lease is gone. Waits for nothing long (the handler's own
-- row; a Complete of it cannot be in flight while its handler runs).
UPDATE jobrun.jobs AS jobs
SET progress = sqlc.arg(progress)::float8, progress_message = sqlc.narg(message)::text,
    progress_at = now()
WHERE jobs.id = sqlc.arg(id)::uuid AND jobs.state::text = 'leased'
  AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.lease_token = sqlc.arg(token)::uuid
RETURNING jobs.progress_at;

-- name: HeartbeatJobs :many
-- Extends the live leases of this owner (owner + token match, not expired,
-- cancel not requested) to until, and returns the ids of those live leases:
-- the ids it omits are the jobs the worker must cancel. A row another
-- transaction holds (its own Complete, an admin's cancel) is skipped, not
-- waited for, and still counts as live when its lease was live at the start
-- of the statement: a heartbeat never stalls behind a long commit callable,
-- and the next one extends that row. Rows are locked in id order. It commits
-- asynchronously, like the claim: a heartbeat lost in a server crash only
-- makes a lease look shorter, and the fence keeps a reaped job safe. A lease
-- only moves forward: an until earlier than the current expiry leaves the
-- expiry where it is (the lease is still reported kept).
WITH lease AS (
    SELECT unnest(sqlc.arg(ids)::uuid[]) AS id, unnest(sqlc.arg(tokens)::uuid[]) AS token
), valid AS (
    SELECT jobs.id, lease.token FROM jobrun.jobs AS jobs JOIN lease ON jobs.id = lease.id
    WHERE jobs.lease_token = lease.token AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text
      AND jobs.lease_expires_at > now() AND NOT jobs.cancel_requested
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
), live AS (
    SELECT jobs.id, valid.token FROM jobrun.jobs AS jobs JOIN valid ON jobs.id = valid.id
    ORDER BY jobs.id
    FOR UPDATE OF jobs SKIP LOCKED
), extended AS (
    UPDATE jobrun.jobs AS jobs
    SET lease_expires_at = GREATEST(jobs.lease_expires_at, sqlc.arg(until)::timestamptz),
        updated_at = now()
    FROM live
    WHERE jobs.id = live.id AND jobs.lease_token = live.token AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text
      AND jobs.lease_expires_at > now() AND NOT jobs.cancel_requested
    RETURNING jobs.id
), seen AS (
    -- The worker's registry row rides along (jobrun.workers, migration
    -- 0013): a busy worker is seen alive by its heartbeat, with no round
    -- trip of its own.
    UPDATE jobrun.workers AS w SET last_seen_at = now()
    WHERE w.id = sqlc.arg(owner)::text
    RETURNING w.id
)
SELECT valid.id FROM valid
WHERE (SELECT count(*) FROM extended) >= 0 AND (SELECT count(*) FROM seen) >= 0;

-- name: StartJobs :many
-- @deferred
-- A worker is about to run jobs it leased without starting them (claimed
-- with the others' start, they waited for a thread): each one's attempt is
-- burned and started_at set, owner- and token-fenced like a heartbeat, for
-- a live lease (not expired, cancel not requested). Returns the ids that
-- hold such a lease and are started, with their attempt count: a job left
-- out must not run (its lease is gone, or its cancel was requested). A job
-- this claim already started is returned as it stands and counted once
-- (a call retried after its reply was lost). Commits asynchronously like
-- the claim: a start lost in a server crash goes with its claim.
WITH lease AS (
    SELECT unnest(sqlc.arg(ids)::uuid[]) AS id, unnest(sqlc.arg(tokens)::uuid[]) AS token
), started AS (
    UPDATE jobrun.jobs AS jobs
    SET attempts = jobs.attempts + (jobs.started_at IS NULL)::int4,
        started_at = COALESCE(jobs.started_at, now()),
        updated_at = now()
    FROM lease
    WHERE jobs.id = lease.id AND jobs.lease_token = lease.token AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text
      AND jobs.lease_expires_at > now() AND NOT jobs.cancel_requested
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    RETURNING jobs.id, jobs.attempts, jobs.started_at
)
SELECT started.id, started.attempts, started.started_at::timestamptz AS started_at FROM started;

-- name: LockJob :one
-- The job locked for an admin change (cancel, retry, signal). With a
-- channel, a runnable job's queue (queued and due) is woken at COMMIT: a
-- claim passes by the row while this holds it (docs/architecture.md, "Who
-- holds a runnable row wakes its queue"). Without one (a cancel, or a retry
-- that wakes the queue itself once the job is requeued), no wake-up.
WITH locked AS (
    SELECT * FROM jobrun.jobs AS jobs WHERE id = sqlc.arg(id) FOR UPDATE
), wake AS (
    SELECT pg_notify(sqlc.narg(channel)::text, locked.queue) FROM locked
    WHERE sqlc.narg(channel)::text IS NOT NULL
      AND locked.state = 'queued' AND locked.run_at <= clock_timestamp()
      AND pg_notification_queue_usage() < sqlc.arg(max_notify_usage)::float8
)
SELECT locked.* FROM locked WHERE (SELECT count(*) FROM wake) >= 0;

-- name: CompleteBegin :one
-- The first statement of Complete, after BEGIN and the transaction's
-- statement_timeout (commit_timeout, set before this statement so that it
-- bounds this row lock's wait too): the job row locked, and, when this claim
-- (owner + token) holds a live lease without a cancel request, its ledger
-- row. effect_new says whether the ledger row is new, i.e. whether the
-- commit callable must run; finished_by_claim that this very claim already
-- finished the job (a Complete retried after its COMMIT reply was lost).
-- No row back: the job is gone.
WITH j AS (
    SELECT jobs.id, jobs.state, jobs.attempts, jobs.cancel_requested,
           COALESCE(jobs.state = 'leased' AND jobs.lease_owner = sqlc.arg(owner)::text
                    AND jobs.lease_token = sqlc.arg(token)::uuid, false)::boolean AS owned,
           COALESCE(jobs.finished_token = sqlc.arg(token)::uuid, false)::boolean
               AS finished_by_claim
    FROM jobrun.jobs AS jobs WHERE jobs.id = sqlc.arg(id)::uuid
    FOR UPDATE
), eff AS (
    INSERT INTO jobrun.processed_effects (scope, key, job_id)
    SELECT sqlc.arg(scope)::text, sqlc.arg(key)::text, j.id FROM j
    WHERE j.owned AND NOT j.cancel_requested
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING processed_effects.job_id
)
SELECT j.state, j.attempts, j.owned, j.finished_by_claim, j.cancel_requested,
       EXISTS (SELECT 1 FROM eff) AS effect_new,
       now()::timestamptz AS now
FROM j;

-- name: CompleteFinish :exec
-- The last statement of Complete, sent with COMMIT in one round trip: the
-- owner- and token-guarded end of the lease (succeeded, or cancelled when
-- cancel was requested) with its terminal event, which every event mode
-- records. The row is locked since CompleteBegin, so it matches exactly one
-- row, and its timestamps are the transaction's now() that CompleteBegin
-- returned: nothing needs to come back. The claim's token stays on the row as
-- finished_token (SET reads the row as it was). The handler's result is
-- stored with the success (never with a cancellation), and a client waiting
-- for the job is told on the finish channel.
WITH done AS (
    UPDATE jobrun.jobs AS jobs
    SET state = sqlc.arg(state)::jobrun.job_state, finished_at = now(),
        finished_token = lease_token,
        result = CASE WHEN sqlc.arg(state)::jobrun.job_state = 'succeeded'
                      THEN sqlc.narg(result_json)::jsonb END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now()
    WHERE jobs.id = sqlc.arg(id)::uuid AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.lease_token = sqlc.arg(token)::uuid
    RETURNING jobs.id, jobs.state, jobs.attempts, jobs.notify_finished
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt, detail)
    SELECT done.id, done.state::text, done.attempts, sqlc.narg(detail)::jsonb FROM done
)
SELECT pg_notify(sqlc.arg(finish_channel)::text, done.id::text) FROM done
WHERE done.notify_finished;

-- name: CompleteBeginMany :many
-- The first statement of a batched transactional Complete: CompleteBegin for
-- many jobs of one owner, rows locked in id order (two batches never
-- deadlock). Two jobs of the batch sharing an effect key get one ledger row:
-- only the first runs its commit callable.
WITH input AS (
    SELECT unnest(sqlc.arg(ids)::uuid[]) AS id, unnest(sqlc.arg(tokens)::uuid[]) AS token,
           unnest(sqlc.arg(scopes)::text[]) AS scope, unnest(sqlc.arg(keys)::text[]) AS key
), j AS (
    SELECT jobs.id, jobs.state, jobs.attempts, jobs.cancel_requested,
           COALESCE(jobs.state = 'leased' AND jobs.lease_owner = sqlc.arg(owner)::text
                    AND jobs.lease_token = input.token, false)::boolean AS owned,
           COALESCE(jobs.finished_token = input.token, false)::boolean AS finished_by_claim
    FROM jobrun.jobs AS jobs JOIN input ON input.id = jobs.id
    ORDER BY jobs.id
    FOR UPDATE OF jobs
), eff AS (
    INSERT INTO jobrun.processed_effects (scope, key, job_id)
    SELECT input.scope, input.key, j.id FROM j JOIN input ON input.id = j.id
    WHERE j.owned AND NOT j.cancel_requested
    ORDER BY j.id
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING processed_effects.job_id
)
SELECT j.id, j.state, j.attempts, j.owned, j.finished_by_claim, j.cancel_requested,
       (j.id IN (SELECT eff.job_id FROM eff))::boolean AS effect_new,
       now()::timestamptz AS now
FROM j;

-- name: CompleteFinishMany :exec
-- The last statement of a batched transactional Complete, pipelined with
-- COMMIT: each job's guarded end of lease with its terminal event.
WITH input AS (
    SELECT unnest(sqlc.arg(ids)::uuid[]) AS id, unnest(sqlc.arg(states)::jobrun.job_state[]) AS state,
           unnest(sqlc.arg(details)::jsonb[]) AS detail,
           unnest(sqlc.arg(results)::jsonb[]) AS result
), done AS (
    UPDATE jobrun.jobs AS jobs
    SET state = input.state, finished_at = now(), finished_token = lease_token,
        result = CASE WHEN input.state = 'succeeded' THEN input.result END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now()
    FROM input
    WHERE jobs.id = input.id AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text
    RETURNING jobs.id, jobs.state, jobs.attempts, jobs.notify_finished, input.detail
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt, detail)
    SELECT done.id, done.state::text, done.attempts, done.detail FROM done
)
SELECT pg_notify(sqlc.arg(finish_channel)::text, done.id::text) FROM done
WHERE done.notify_finished;

-- name: FailJob :one
-- The owner- and token-guarded failure of an attempt, verdict included, in
-- one statement: cancelled when cancel was requested (cancel wins), dead when
-- permanent or no attempts are left, otherwise queued again at retry_at. The
-- SET expressions read the row as it was before the update. Its event is
-- written in the same statement ("retrying" only when write_all).
WITH failed AS (
    UPDATE jobrun.jobs AS jobs
    SET state = CASE
            WHEN cancel_requested THEN 'cancelled'
            WHEN sqlc.arg(permanent)::boolean OR attempts >= max_attempts THEN 'dead'
            ELSE 'queued' END::jobrun.job_state,
        run_at = CASE
            WHEN cancel_requested OR sqlc.arg(permanent)::boolean OR attempts >= max_attempts
            THEN run_at
            ELSE COALESCE(sqlc.narg(retry_at)::timestamptz, now()) END,
        finished_at = CASE
            WHEN cancel_requested OR sqlc.arg(permanent)::boolean OR attempts >= max_attempts
            THEN now()
            ELSE NULL END,
        last_error = sqlc.arg(error)::text,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now()
    WHERE jobs.id = sqlc.arg(id)::uuid AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.lease_token = sqlc.arg(token)::uuid
    RETURNING *
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt, detail)
    SELECT failed.id,
           CASE failed.state WHEN 'queued' THEN 'retrying' ELSE failed.state::text END,
           failed.attempts,
           jsonb_build_object('via', 'fail', 'error', left(sqlc.arg(error)::text, 1000),
                              'permanent', sqlc.arg(permanent)::boolean)
    FROM failed
    WHERE sqlc.arg(write_all)::boolean OR failed.state <> 'queued'
), wake AS (
    SELECT pg_notify(sqlc.arg(finish_channel)::text, failed.id::text) FROM failed
    WHERE failed.state <> 'queued' AND failed.notify_finished
)
SELECT * FROM failed WHERE (SELECT count(*) FROM wake) >= 0;

-- name: CompleteJobs :many
-- @deferred
-- complete_many: every job still leased by this owner and token ends
-- succeeded (or cancelled when cancel was requested), with its events, in
-- one statement. A job this very claim already finished (a batch retried
-- after its COMMIT reply was lost: finished_token matches) is returned as it
-- stands, and changes nothing. Ids not returned lost their lease.
-- complete_and_claim sends it first in a limited claim's transaction, so
-- that the claim counts the slots it frees.
--
-- What it writes per job, and no more: the row's new version (its entries
-- in jobs_pkey and jobs_finished_at_idx), one event, and a ledger row only
-- for a succeeded job with an idempotency key, the one case where another
-- job can share its effect key (same type and key, another queue). A job
-- without one has its own id as key, which no other job can reach; its
-- success is read from the row itself (EffectDone). The rows are not
-- locked first (FOR UPDATE wrote a lock record per row before the update
-- wrote its version): the UPDATE takes them as it reaches them, the input
-- sorted by id, and reads cancel_requested from the version it replaces
-- (a cancel committed meanwhile is seen). No statement waits for several
-- leased rows at once (heartbeats and the reaper skip locked rows, a
-- cancel takes one), so no lock order is needed against deadlocks. The
-- replay check ("before") reads only the ids the update did not take.
-- A keyed job's effect key is read from its row ('job:' || type, its key,
-- as EffectKey.of), not sent: most jobs have none, and sending every job's
-- scope and key as text cost the worker more than the ids. results is NULL
-- when no job of the batch returned a value (no array of NULLs to send).
--
-- It tests "state::text = 'leased'", never "state = 'leased'", as does every
-- statement that finds leased jobs by id: the latter is
-- jobs_leased_queue_idx's predicate, and a generic plan made when
-- statistics saw few leased rows (an ANALYZE at a quiet moment) read that
-- whole index, every worker's leases, to find the few ids it was given,
-- rather than look them up in jobs_pkey (tests/postgres/test_store_churn.py
-- checks each such statement). The reaper, the limits and the dashboard,
-- which want every leased row, still read the index.
WITH input AS (
    SELECT unnest(sqlc.arg(ids)::uuid[]) AS id, unnest(sqlc.arg(tokens)::uuid[]) AS token,
           unnest(sqlc.narg(results)::jsonb[]) AS result
    ORDER BY 1
), done AS (
    UPDATE jobrun.jobs AS jobs
    SET state = CASE WHEN jobs.cancel_requested THEN 'cancelled' ELSE 'succeeded' END::jobrun.job_state,
        finished_at = now(), finished_token = jobs.lease_token,
        result = CASE WHEN jobs.cancel_requested THEN NULL ELSE input.result END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now()
    FROM input
    WHERE jobs.id = input.id AND jobs.lease_token = input.token
      AND jobs.state::text = 'leased' AND jobs.lease_owner = sqlc.arg(owner)::text
    RETURNING jobs.id, jobs.state, jobs.attempts, jobs.notify_finished, jobs.type,
              jobs.idempotency_key
), effects AS (
    INSERT INTO jobrun.processed_effects (scope, key, job_id)
    SELECT 'job:' || done.type, done.idempotency_key, done.id FROM done
    WHERE done.idempotency_key IS NOT NULL AND done.state = 'succeeded'
    ON CONFLICT (scope, key) DO NOTHING
), wake AS (
    SELECT pg_notify(sqlc.arg(finish_channel)::text, done.id::text) FROM done
    WHERE done.notify_finished
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt, detail)
    SELECT done.id, done.state::text, done.attempts,
           CASE WHEN done.state = 'cancelled'
                THEN '{"via": "complete"}'::jsonb END
    FROM done
), before AS (
    SELECT jobs.id, jobs.state FROM input
    JOIN jobrun.jobs AS jobs ON jobs.id = input.id AND jobs.finished_token = input.token
    WHERE input.id NOT IN (SELECT done.id FROM done)
)
SELECT done.id, done.state FROM done WHERE (SELECT count(*) FROM wake) >= 0
UNION ALL
SELECT before.id, before.state FROM before;

-- name: SelectExpiredLeases :many
-- The reaper's first step: expired leases, locked, skipping rows another
-- transaction holds (a Complete in flight wins the race).
SELECT * FROM jobrun.jobs AS jobs
WHERE state = 'leased' AND lease_expires_at < sqlc.arg(now)::timestamptz
ORDER BY id
LIMIT sqlc.arg(max_jobs)
FOR UPDATE SKIP LOCKED;

-- name: ReapJob :batchone
-- One per expired lease, sent as one batch. It re-checks the lease it
-- selected (state, token, expiry) in the same statement, so a row that
-- finished in between is never rewritten. A job it ends (dead, cancelled)
-- wakes a client waiting for it. It never changes attempts (an attempt
-- counts when it starts); a NULL last_error keeps the row's (a lease that
-- never started takes nothing from the job's story).
WITH reaped AS (
    UPDATE jobrun.jobs AS jobs
    SET state = sqlc.arg(state)::jobrun.job_state,
        run_at = COALESCE(sqlc.narg(run_at)::timestamptz, run_at),
        finished_at = CASE WHEN sqlc.arg(state)::jobrun.job_state = 'queued' THEN NULL ELSE now() END,
        last_error = COALESCE(sqlc.narg(last_error)::text, last_error),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now()
    WHERE id = sqlc.arg(id) AND state::text = 'leased' AND lease_token = sqlc.arg(token)::uuid
      AND lease_expires_at < sqlc.arg(now)::timestamptz
    RETURNING jobs.id, jobs.state, jobs.notify_finished
), wake AS (
    SELECT pg_notify(sqlc.arg(finish_channel)::text, reaped.id::text) FROM reaped
    WHERE reaped.state <> 'queued' AND reaped.notify_finished
)
SELECT reaped.id FROM reaped WHERE (SELECT count(*) FROM wake) >= 0;

-- name: GetJob :one
SELECT * FROM jobrun.jobs AS jobs WHERE id = sqlc.arg(id);

-- name: ListJobs :many
-- Keyset pagination by id (time-ordered ids: oldest first).
SELECT * FROM jobrun.jobs AS jobs
WHERE (sqlc.narg(queue)::text IS NULL OR queue = sqlc.narg(queue)::text)
  AND (sqlc.narg(state)::jobrun.job_state IS NULL OR state = sqlc.narg(state)::jobrun.job_state)
  AND (sqlc.narg(type)::text IS NULL OR type = sqlc.narg(type)::text)
  AND (sqlc.narg(after)::uuid IS NULL OR id > sqlc.narg(after)::uuid)
ORDER BY id
LIMIT sqlc.arg(max_rows);

-- name: CancelQueuedJob :one
-- A queued or waiting job cancelled at once (waking a client waiting for
-- it); a waiting job's dependents follow by their policy (the trigger of
-- migration 0016).
WITH cancelled AS (
    UPDATE jobrun.jobs AS jobs SET state = 'cancelled', finished_at = now(), updated_at = now()
    WHERE id = sqlc.arg(id) AND state IN ('queued', 'waiting')
    RETURNING *
), wake AS (
    SELECT pg_notify(sqlc.arg(finish_channel)::text, cancelled.id::text) FROM cancelled
    WHERE cancelled.notify_finished
)
SELECT cancelled.* FROM cancelled WHERE (SELECT count(*) FROM wake) >= 0;

-- name: RequestCancel :one
UPDATE jobrun.jobs AS jobs SET cancel_requested = true, updated_at = now()
WHERE id = sqlc.arg(id) AND state::text = 'leased'
RETURNING *;

-- name: RequeueJob :one
-- Retry: make the job runnable now. From a terminal state the attempts start
-- again from zero (and the releases of workers that lacked its handler) and
-- the cancel flag is cleared; last_error is kept until the next attempt
-- overwrites it. A job a parent's failure cancelled runs at once: its
-- parents are not waited for again (pending_parents cleared).
UPDATE jobrun.jobs AS jobs
SET state = 'queued', run_at = now(), attempts = CASE WHEN state = 'queued' THEN attempts ELSE 0 END,
    releases = CASE WHEN state = 'queued' THEN releases ELSE 0 END,
    cancel_requested = false, finished_at = NULL, finished_token = NULL, result = NULL,
    notify_finished = false, pending_parents = 0, updated_at = now()
WHERE id = sqlc.arg(id) AND state IN ('queued', 'succeeded', 'dead', 'cancelled')
RETURNING *;

-- name: LockPurges :exec
-- The first statement of a purge's transaction: purges run one after the
-- other (a transaction-level advisory lock, jobrun's namespace 0x6A6F62 and
-- purpose 4: 1 is the migrations', 2 the leader's, 3 the demo's), so that
-- PurgeJobs, the next statement, sees every purge before it committed.
SELECT pg_advisory_xact_lock(6975330, 4);

-- name: PurgeJobs :execrows
-- Terminal jobs finished longer ago than the age, oldest first, at most
-- max_jobs per call (short locks; the caller loops), with their durable
-- steps and fencing token (migration 0015), its waits and signals
-- (migration 0017): no foreign key, so that no update of a job pays for a
-- trigger; only a job's lease holder writes steps and waits (a job being
-- purged has none), and a signal is refused to a finished job. A job that
-- had parents takes its edges with it (migration 0016; a plain job costs no
-- lookup). A workflow's job takes its row of workflow_jobs with it
-- (migration 0024), and a workflow whose last jobs go goes with them (its
-- row in workflows, and its workflow signals of migration 0019), found
-- through workflow_jobs' primary key: the jobs of its own still there are
-- read with this statement's snapshot, which LockPurges makes exact (else
-- two purges at once, each deleting half of one workflow's last jobs, would
-- both see the other's half and leave its row). A workflow's job takes its
-- deliveries of workflow signals with it.
WITH victims AS (
    SELECT jobs.id, jobs.on_parent_failure IS NOT NULL AS had_parents, jobs.workflow_id
    FROM jobrun.jobs AS jobs
    WHERE finished_at IS NOT NULL
      AND finished_at < now() - make_interval(secs => sqlc.arg(age_seconds)::float8)
    ORDER BY finished_at
    LIMIT sqlc.arg(max_jobs)
    FOR UPDATE SKIP LOCKED
), steps AS (
    DELETE FROM jobrun.job_steps AS steps USING victims WHERE steps.job_id = victims.id
), fences AS (
    DELETE FROM jobrun.job_fences AS fences USING victims WHERE fences.job_id = victims.id
), edges AS (
    DELETE FROM jobrun.job_dependencies AS d
    WHERE d.child_id = ANY(ARRAY(SELECT victims.id FROM victims WHERE victims.had_parents))
), waits AS (
    DELETE FROM jobrun.job_waits AS waits USING victims WHERE waits.job_id = victims.id
), signals AS (
    DELETE FROM jobrun.job_signals AS signals USING victims WHERE signals.job_id = victims.id
), members AS (
    DELETE FROM jobrun.workflow_jobs AS m USING victims
    WHERE victims.workflow_id IS NOT NULL
      AND m.workflow_id = victims.workflow_id AND m.job_id = victims.id
), flows AS (
    DELETE FROM jobrun.workflows AS w
    WHERE w.id IN (SELECT DISTINCT victims.workflow_id FROM victims
                   WHERE victims.workflow_id IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM jobrun.workflow_jobs AS left_ WHERE left_.workflow_id = w.id
                      AND left_.job_id <> ALL(ARRAY(SELECT victims.id FROM victims)))
    RETURNING w.id
), deliveries AS (
    DELETE FROM jobrun.workflow_signal_deliveries AS d USING victims
    WHERE victims.workflow_id IS NOT NULL AND d.job_id = victims.id
), workflow_signals AS (
    DELETE FROM jobrun.workflow_signals AS ws USING flows WHERE ws.workflow_id = flows.id
)
DELETE FROM jobrun.jobs AS jobs USING victims WHERE jobs.id = victims.id;

-- name: CountPurgeable :one
-- @nullable oldest newest
-- What PurgeJobs would delete at the same age: a purge's dry run and its
-- confirmation count, with the span of finish times it covers.
SELECT count(*)::int8 AS jobs,
       min(finished_at)::timestamptz AS oldest,
       max(finished_at)::timestamptz AS newest
FROM jobrun.jobs AS jobs
WHERE finished_at IS NOT NULL
  AND finished_at < now() - make_interval(secs => sqlc.arg(age_seconds)::float8);

-- name: QueueDepth :many
SELECT queue,
       count(*) FILTER (WHERE state = 'queued' AND run_at <= now())::int8 AS ready,
       count(*) FILTER (WHERE state = 'queued' AND run_at > now())::int8 AS scheduled,
       count(*) FILTER (WHERE state = 'leased')::int8 AS leased,
       count(*) FILTER (WHERE state = 'dead')::int8 AS dead
FROM jobrun.jobs AS jobs
WHERE state IN ('queued', 'leased', 'dead')
GROUP BY queue
ORDER BY queue;

-- name: PauseQueue :exec
INSERT INTO jobrun.queue_pauses (queue) VALUES (sqlc.arg(queue)) ON CONFLICT (queue) DO NOTHING;

-- name: ResumeQueue :one
-- The pause lifted and the wake-up sent in one statement (one transaction:
-- a notification always commits with the change it announces). No row back:
-- the queue was not paused. notify_queue_usage as in EnqueueJob.
WITH gone AS (
    DELETE FROM jobrun.queue_pauses WHERE queue = sqlc.arg(queue) RETURNING queue
), usage AS (
    SELECT pg_notification_queue_usage() AS used FROM gone
), wake AS (
    SELECT pg_notify(sqlc.arg(channel)::text, gone.queue) FROM gone, usage
    WHERE usage.used < sqlc.arg(max_notify_usage)::float8
)
SELECT COALESCE((SELECT usage.used FROM usage), 0)::float8 AS notify_queue_usage
FROM gone WHERE (SELECT count(*) FROM wake) >= 0;

-- name: PausedQueues :many
SELECT queue FROM jobrun.queue_pauses ORDER BY queue;

-- name: DbNow :one
SELECT now()::timestamptz AS now;

-- name: Notify :one
-- A wake-up inside the caller's transaction (delivered at its COMMIT),
-- skipped when the notification queue is max_notify_usage full (see
-- EnqueueJob). With a run_at still ahead of the database clock, the payload
-- carries the delay as EnqueueJob's does: <payload>@<milliseconds, rounded
-- up>. Returns the queue's usage.
WITH usage AS (
    SELECT pg_notification_queue_usage() AS used,
           ceil(1000 * extract(epoch FROM sqlc.narg(run_at)::timestamptz - clock_timestamp()))::int8
               AS delay_ms
), wake AS (
    SELECT pg_notify(sqlc.arg(channel)::text,
                     CASE WHEN usage.delay_ms > 0
                          THEN sqlc.arg(payload)::text || '@' || usage.delay_ms
                          ELSE sqlc.arg(payload)::text END)
    FROM usage
    WHERE usage.used < sqlc.arg(max_notify_usage)::float8
)
SELECT usage.used::float8 AS notify_queue_usage FROM usage
WHERE (SELECT count(*) FROM wake) >= 0;

-- name: NotifyQueueBlockers :many
-- Who may be holding the notification queue back: sessions idle in a
-- transaction, oldest first (a LISTENing session that never ends its
-- transaction keeps every notification sent since it began from being
-- freed). Without pg_read_all_stats, other roles' sessions show no state.
SELECT a.pid::int4 AS pid, COALESCE(a.application_name, '')::text AS application_name,
       COALESCE(a.state, '')::text AS state, a.xact_start::timestamptz AS xact_start
FROM pg_stat_get_activity(NULL) AS a
WHERE a.state IN ('idle in transaction', 'idle in transaction (aborted)')
ORDER BY a.xact_start
LIMIT 5;

-- name: CountByState :many
-- Jobs and attempts per state, for one queue or all.
SELECT state, count(*)::int8 AS jobs, COALESCE(sum(attempts), 0)::int8 AS attempts
FROM jobrun.jobs AS jobs
WHERE sqlc.narg(queue)::text IS NULL OR queue = sqlc.narg(queue)::text
GROUP BY state
ORDER BY state;

-- name: SchemaVersion :one
-- The version of the schema this database holds (see migration 0004).
SELECT version FROM jobrun.schema_version;

-- name: WatchJob :one
-- A client is about to wait for the job: ask every transition that ends it to
-- notify the finish channel (the client LISTENs first). Returns the job as it
-- stands; a job that has already finished needs no waiting. Waits for a
-- Complete in flight (it holds the row), so the answer is never stale.
-- A runnable job's queue is woken at COMMIT: a claim passes by the row while
-- this holds it (SKIP LOCKED), and its worker would otherwise sleep until
-- its next poll (docs/architecture.md, "Who holds a runnable row wakes its
-- queue"). A job not yet due is not claimed anyway.
WITH watched AS (
    UPDATE jobrun.jobs AS jobs SET notify_finished = true
    WHERE id = sqlc.arg(id)
    RETURNING *
), wake AS (
    SELECT pg_notify(sqlc.arg(channel)::text, watched.queue) FROM watched
    WHERE watched.state = 'queued' AND watched.run_at <= clock_timestamp()
      AND pg_notification_queue_usage() < sqlc.arg(max_notify_usage)::float8
)
SELECT watched.* FROM watched WHERE (SELECT count(*) FROM wake) >= 0;

-- name: ReleaseJob :one
-- Give a claimed job back without counting its attempt (a worker that has no
-- handler for its type, or a handler that snoozes: asks to run later):
-- queued again at now() + delay with the attempt its start burned returned
-- (none when it never started: started_at NULL), owner- and token-guarded
-- like Fail, with a "released" event (counted in releases; "snoozed", counted
-- in snoozes, when snooze). A job whose cancel was requested ends cancelled instead (cancel
-- wins).
WITH released AS (
    UPDATE jobrun.jobs AS jobs
    SET state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END::jobrun.job_state,
        attempts = CASE WHEN cancel_requested OR started_at IS NULL THEN attempts
                        ELSE greatest(attempts - 1, 0) END,
        snoozes = CASE WHEN NOT cancel_requested AND sqlc.arg(snooze)::boolean
                       THEN snoozes + 1 ELSE snoozes END,
        releases = CASE WHEN NOT cancel_requested AND NOT sqlc.arg(snooze)::boolean
                        THEN releases + 1 ELSE releases END,
        run_at = CASE WHEN cancel_requested THEN run_at
                      ELSE now() + make_interval(secs => sqlc.arg(delay_seconds)::float8) END,
        finished_at = CASE WHEN cancel_requested THEN now() END,
        last_error = CASE WHEN sqlc.arg(snooze)::boolean AND NOT cancel_requested THEN last_error
                          ELSE sqlc.arg(reason)::text END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now()
    WHERE jobs.id = sqlc.arg(id)::uuid AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.lease_token = sqlc.arg(token)::uuid
    RETURNING *
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt, detail)
    SELECT released.id,
           CASE WHEN released.state <> 'queued' THEN 'cancelled'
                WHEN sqlc.arg(snooze)::boolean THEN 'snoozed'
                ELSE 'released' END,
           released.attempts,
           jsonb_build_object('via', CASE WHEN sqlc.arg(snooze)::boolean THEN 'snooze' ELSE 'release' END,
                              'reason', left(sqlc.arg(reason)::text, 1000),
                              'delay_seconds', sqlc.arg(delay_seconds)::float8)
    FROM released
    WHERE sqlc.arg(write_all)::boolean OR released.state <> 'queued'
), wake AS (
    SELECT pg_notify(sqlc.arg(finish_channel)::text, released.id::text) FROM released
    WHERE released.state <> 'queued' AND released.notify_finished
)
SELECT * FROM released WHERE (SELECT count(*) FROM wake) >= 0;

-- name: UnclaimJobs :many
-- Give back leases that never started (the jobs a stopping worker held in
-- its buffer, claimed ahead of its free threads): queued again as they
-- were, run_at, attempts and releases unchanged (no attempt was counted,
-- and this is no release of the job's doing), owner- and token-fenced, and
-- only while started_at is NULL: a started job is never given back here. A
-- job whose cancel was requested ends cancelled instead (cancel wins). A
-- "released" event {"via": "unclaim"} each (a "cancelled" one always), and
-- one wake-up per queue given jobs back, so that other workers take them
-- at once. Returns the ids given back or cancelled, with their state.
WITH lease AS (
    SELECT unnest(sqlc.arg(ids)::uuid[]) AS id, unnest(sqlc.arg(tokens)::uuid[]) AS token
), gone AS (
    UPDATE jobrun.jobs AS jobs
    SET state = CASE WHEN jobs.cancel_requested THEN 'cancelled'
                     ELSE 'queued' END::jobrun.job_state,
        finished_at = CASE WHEN jobs.cancel_requested THEN now() END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now()
    FROM lease
    WHERE jobs.id = lease.id AND jobs.lease_token = lease.token AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.started_at IS NULL
    RETURNING jobs.id, jobs.queue, jobs.state, jobs.attempts, jobs.notify_finished
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt, detail)
    SELECT gone.id, CASE WHEN gone.state = 'queued' THEN 'released' ELSE 'cancelled' END,
           gone.attempts,
           jsonb_build_object('via', 'unclaim',
                              'reason', 'the worker stopped before it started the job')
    FROM gone
    WHERE sqlc.arg(write_all)::boolean OR gone.state <> 'queued'
), finished AS (
    SELECT pg_notify(sqlc.arg(finish_channel)::text, gone.id::text) FROM gone
    WHERE gone.state <> 'queued' AND gone.notify_finished
), wake AS (
    SELECT pg_notify(sqlc.arg(channel)::text, requeued.queue)
    FROM (SELECT DISTINCT gone.queue FROM gone WHERE gone.state = 'queued') AS requeued
    WHERE pg_notification_queue_usage() < sqlc.arg(max_notify_usage)::float8
)
SELECT gone.id, gone.state FROM gone
WHERE (SELECT count(*) FROM finished) >= 0 AND (SELECT count(*) FROM wake) >= 0;
