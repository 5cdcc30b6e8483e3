-- Cluster-wide statistics: what jobrun.observe.metrics exports once per
-- cluster (jobrun.postgres.stats runs them, nothing else does).
--
-- A jobs table only grows in finished rows, so none of these may read the
-- table's history: each count reads one partial index whose predicate its
-- WHERE repeats exactly (jobs_claim_idx for queued, jobs_leased_queue_idx
-- for leased, jobs_dead_idx for dead), never a sequential scan of jobs
-- (tests/postgres/test_cluster_stats.py EXPLAINs them on a table of many
-- succeeded rows). Ages are read from the database clock.

-- name: ClusterQueueStats :many
-- Per queue: queued jobs due now (ready) and due later (scheduled), the age
-- of the oldest ready one, leased and dead jobs, and whether the queue is
-- paused. jobs_claim_idx holds (queue, run_at) for every queued job, so the
-- first part is an index-only scan; leased rows are a few per worker
-- thread; jobs_dead_idx holds the queue of every dead job. A paused queue
-- with no jobs is listed too (zero counts), so that it reads as paused.
WITH queued AS (
    SELECT jobs.queue,
           count(*) FILTER (WHERE jobs.run_at <= now()) AS ready,
           count(*) FILTER (WHERE jobs.run_at > now()) AS scheduled,
           min(jobs.run_at) FILTER (WHERE jobs.run_at <= now()) AS oldest_ready_at
    FROM jobrun.jobs AS jobs
    WHERE jobs.state = 'queued'
    GROUP BY jobs.queue
), leased AS (
    SELECT jobs.queue, count(*) AS leased
    FROM jobrun.jobs AS jobs
    WHERE jobs.state = 'leased'
    GROUP BY jobs.queue
), dead AS (
    SELECT jobs.queue, count(*) AS dead
    FROM jobrun.jobs AS jobs
    WHERE jobs.state = 'dead'
    GROUP BY jobs.queue
), names AS (
    SELECT queued.queue FROM queued
    UNION SELECT leased.queue FROM leased
    UNION SELECT dead.queue FROM dead
    UNION SELECT p.queue FROM jobrun.queue_pauses AS p
)
SELECT names.queue::text AS queue,
       COALESCE(queued.ready, 0)::int8 AS ready,
       COALESCE(queued.scheduled, 0)::int8 AS scheduled,
       COALESCE(leased.leased, 0)::int8 AS leased,
       COALESCE(dead.dead, 0)::int8 AS dead,
       COALESCE(EXTRACT(EPOCH FROM now() - queued.oldest_ready_at), 0)::float8
           AS oldest_ready_seconds,
       EXISTS (SELECT 1 FROM jobrun.queue_pauses AS p WHERE p.queue = names.queue)::boolean
           AS paused
FROM names
LEFT JOIN queued ON queued.queue = names.queue
LEFT JOIN leased ON leased.queue = names.queue
LEFT JOIN dead ON dead.queue = names.queue
ORDER BY names.queue;

-- name: ClusterLeader :many
-- The scheduler's leader in this database: the sessions holding its leader
-- lock (a session advisory lock, see jobrun.postgres.lock: two-int keys
-- appear in pg_locks as classid, objid and objsubid = 2), and the holder of
-- its unexpired lease row in jobrun.leader (the election of workers behind a
-- transaction pooler, see jobrun.postgres.leader: holder and term, no
-- session of its own). One row while there is a leader, none while there is
-- none. pg_stat_activity names a lock's session; its application_name and
-- address are blank when this role may not see another role's sessions
-- (grant pg_read_all_stats to see them). worker: the registered worker
-- (jobrun.workers) whose scheduler leads, blank when none is registered
-- (a scheduler-only process).
SELECT l.pid::int4 AS pid,
       COALESCE(a.application_name, '')::text AS application_name,
       COALESCE(host(a.client_addr), '')::text AS client_addr,
       ''::text AS holder,
       0::int8 AS term,
       COALESCE((SELECT min(w.id) FROM jobrun.workers AS w WHERE w.leader_pid = l.pid),
                '')::text AS worker
FROM pg_catalog.pg_locks AS l
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
  AND l.classid = sqlc.arg(lock_class)::int4::oid
  AND l.objid = sqlc.arg(lock_object)::int4::oid
  AND l.objsubid = 2
  AND l.granted
  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d
                    WHERE d.datname = current_database())
UNION ALL
SELECT 0::int4, ''::text, ''::text, e.holder::text, e.term::int8,
       COALESCE((SELECT w.id FROM jobrun.workers AS w WHERE w.id = e.holder), '')::text
FROM jobrun.leader AS e
WHERE e.name = sqlc.arg(election)::text AND e.expires_at > now()
ORDER BY 1, 4;

-- name: ClusterSchedules :many
-- Every schedule's next run and last fire (NULL until its first occurrence
-- is materialised). Schedule ids are chosen by the operator: a bounded set.
SELECT s.id, s.next_run_at, s.last_fired_at, s.paused
FROM jobrun.schedules AS s
ORDER BY s.id;

-- name: ClusterNotifyUsage :one
-- How full the server's notification queue is (0 to 1), with the database
-- clock at the same instant.
SELECT pg_notification_queue_usage()::float8 AS usage, now()::timestamptz AS db_now;

-- name: ClusterRecentWorkflows :many
-- The workflows created in the last window_seconds (by the database clock),
-- newest first, at most max_rows, each with its jobs by state and its last
-- finish (its created_at while none has finished): jobrun.observe.metrics
-- derives their states (WorkflowState.of) and times to completion from
-- them. Its cost: the
-- window's rows of workflows_created_idx, and each counted workflow's jobs
-- read through workflow_jobs' primary key (migration 0024); never
-- the history of other jobs.
WITH recent AS (
    SELECT w.id, w.created_at
    FROM jobrun.workflows AS w
    WHERE w.created_at >= now() - make_interval(secs => sqlc.arg(window_seconds)::float8)
    ORDER BY w.created_at DESC, w.id DESC
    LIMIT sqlc.arg(max_rows)
)
SELECT recent.id, recent.created_at,
       c.waiting, c.queued, c.leased, c.succeeded, c.dead, c.cancelled, c.finished_at
FROM recent
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE jobs.state = 'waiting')::int8 AS waiting,
           count(*) FILTER (WHERE jobs.state = 'queued')::int8 AS queued,
           count(*) FILTER (WHERE jobs.state = 'leased')::int8 AS leased,
           count(*) FILTER (WHERE jobs.state = 'succeeded')::int8 AS succeeded,
           count(*) FILTER (WHERE jobs.state = 'dead')::int8 AS dead,
           count(*) FILTER (WHERE jobs.state = 'cancelled')::int8 AS cancelled,
           COALESCE(max(jobs.finished_at), recent.created_at)::timestamptz AS finished_at
    FROM jobrun.workflow_jobs AS m JOIN jobrun.jobs AS jobs ON jobs.id = m.job_id
    WHERE m.workflow_id = recent.id
) AS c
ORDER BY recent.created_at DESC, recent.id DESC;
