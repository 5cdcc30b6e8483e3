-- depends: 0012.queue_churn

-- Workers as first-class objects (issue 28): each running worker's row,
-- written by the worker itself, so that an idle worker is seen too (the
-- dashboard used to know workers only as the owners of leases) and so that
-- a claim can tell whether another live worker knows a job's type.
--
-- id is the worker's owner id, the lease_owner of the jobs it holds. The
-- worker inserts its row when it starts (RegisterWorker), keeps last_seen_at
-- fresh with its heartbeat (the database clock; HeartbeatJobs updates it in
-- the same statement, an idle beat runs RegisterWorker again), and deletes
-- it when it stops cleanly. A worker is live while last_seen_at is within
-- its own lease_ttl_seconds; a row not seen for 10 times that (5 minutes
-- with the default 30 s TTL: a worker killed without its stop) is deleted
-- by the next RegisterWorker of any worker.
--
-- leader_pid: the backend pid of this process's scheduler session while it
-- holds the leader's advisory lock (written when it is elected). It is only
-- believed joined with pg_locks (that pid holds the lock now), so a stale
-- value never shows a leader. Behind a transaction pooler the lease row's
-- holder is the worker's id.
--
-- Locks: CREATE TABLE of a new table only; nothing here reads, locks or
-- rewrites jobs, so the migration takes as long at 1,000,000 jobs as on an
-- empty database. The runtime role's DML grants come with the schema's
-- grants like every table's (see docs/workers-registry.md).
CREATE TABLE jobrun.workers (
    id                 text        PRIMARY KEY,
    host               text        NOT NULL,
    pid                int4        NOT NULL,
    version            text        NOT NULL,
    queues             text[]      NOT NULL,
    concurrency        int4        NOT NULL,
    types              text[]      NOT NULL,
    lease_ttl_seconds  float8      NOT NULL,
    started_at         timestamptz NOT NULL DEFAULT now(),
    last_seen_at       timestamptz NOT NULL DEFAULT now(),
    leader_pid         int4,
    CONSTRAINT workers_id_length CHECK (length(id) BETWEEN 1 AND 255),
    CONSTRAINT workers_ttl_positive CHECK (lease_ttl_seconds > 0)
);

UPDATE jobrun.schema_version SET version = 13, at = now();
