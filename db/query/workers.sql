-- The registry of running workers (jobrun.workers, migration 0013). Every
-- time is the database clock. jobrun.postgres.workers runs these; the
-- claims read the table too (ClaimJobs, ClaimLimitedJobs), and HeartbeatJobs
-- keeps a busy worker's last_seen_at fresh.

-- name: RegisterWorker :one
-- A worker's row, inserted at its start and written again by each idle
-- heartbeat (an upsert: a row lost to a prune while the database was away
-- comes back), last_seen_at = now(). The same statement deletes the rows of
-- workers gone for long: not seen for PRUNE_FACTOR (10) times their own
-- lease TTL. Pruning here, not in the scheduler, works without a scheduler
-- and costs no statement of its own: the table holds one row per worker.
WITH gone AS (
    DELETE FROM jobrun.workers AS w
    WHERE w.id <> sqlc.arg(id)::text
      AND w.last_seen_at < now() - make_interval(secs => 10 * w.lease_ttl_seconds)
    RETURNING w.id
)
INSERT INTO jobrun.workers AS w (id, host, pid, version, queues, concurrency, types,
                                 lease_ttl_seconds, started_at, last_seen_at)
VALUES (sqlc.arg(id)::text, sqlc.arg(host)::text, sqlc.arg(pid)::int4, sqlc.arg(version)::text,
        sqlc.arg(queues)::text[], sqlc.arg(concurrency)::int4, sqlc.arg(types)::text[],
        sqlc.arg(lease_ttl_seconds)::float8, now(), now())
ON CONFLICT (id) DO UPDATE
   SET host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version,
       queues = EXCLUDED.queues, concurrency = EXCLUDED.concurrency, types = EXCLUDED.types,
       lease_ttl_seconds = EXCLUDED.lease_ttl_seconds, last_seen_at = now()
RETURNING w.started_at, (SELECT count(*) FROM gone)::int8 AS pruned;

-- name: UnregisterWorker :execrows
-- A worker that stopped cleanly takes its row away.
DELETE FROM jobrun.workers AS w WHERE w.id = sqlc.arg(id)::text;

-- name: MarkWorkerLeader :one
-- The scheduler of worker `id` was elected through the advisory lock, on the
-- session `leader_pid`: noted on its row (and taken off any other row that
-- names the same pid, a pid the server may have reused). Only believed
-- together with pg_locks (ListWorkers), so a stale value shows nothing.
-- marked = 0: the worker has no row yet (its scheduler was elected before
-- its registration reached the database); the scheduler tries again.
WITH cleared AS (
    UPDATE jobrun.workers AS w SET leader_pid = NULL
     WHERE w.id <> sqlc.arg(id)::text AND w.leader_pid = sqlc.narg(leader_pid)::int4
    RETURNING w.id
), marked AS (
    UPDATE jobrun.workers AS w SET leader_pid = sqlc.narg(leader_pid)::int4
     WHERE w.id = sqlc.arg(id)::text
    RETURNING w.id
)
SELECT (SELECT count(*) FROM marked)::int8 AS marked,
       (SELECT count(*) FROM cleared)::int8 AS cleared;

-- name: ListWorkers :many
-- Every registered worker, idle ones included, with whether it is live
-- (seen within its lease TTL), the leases it holds now (through
-- jobs_leased_queue_idx: a few per worker thread), and whether it leads the
-- scheduler now: its leader_pid holds the leader's advisory lock
-- (lock_class, lock_object: see ClusterLeader) or it holds the unexpired
-- lease row of the election (the leader behind a transaction pooler, whose
-- holder is the worker's id).
SELECT w.id, w.host, w.pid, w.version, w.queues, w.concurrency, w.types,
       w.lease_ttl_seconds, w.started_at, w.last_seen_at,
       (w.last_seen_at > now() - make_interval(secs => w.lease_ttl_seconds)) AS live,
       COALESCE(h.leased, 0)::int8 AS leased,
       (EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l
                WHERE l.locktype = 'advisory' AND l.pid = w.leader_pid
                  AND l.classid = sqlc.arg(lock_class)::int4::oid
                  AND l.objid = sqlc.arg(lock_object)::int4::oid
                  AND l.objsubid = 2 AND l.granted
                  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d
                                    WHERE d.datname = current_database()))
        OR EXISTS (SELECT 1 FROM jobrun.leader AS e
                   WHERE e.name = sqlc.arg(election)::text AND e.holder = w.id
                     AND e.expires_at > now())) AS leader,
       now()::timestamptz AS db_now
FROM jobrun.workers AS w
LEFT JOIN (
    SELECT jobs.lease_owner, count(*) AS leased FROM jobrun.jobs AS jobs
    WHERE jobs.state = 'leased' GROUP BY jobs.lease_owner
) AS h ON h.lease_owner = w.id
ORDER BY w.started_at, w.id;
