-- jobrun schema, version 1.
--
-- Every timestamp is timestamptz and every default reads the database clock
-- (now()): the database decides what time it is, never an application host.
--
-- Supported PostgreSQL: 14 and newer. Nothing here needs 16+ (no uuidv7(),
-- no MERGE ... RETURNING); gen_random_uuid() is core since 13.
--
-- Every object lives in the schema jobrun (its migration bookkeeping too), so
-- an application's own "jobs" table never collides, and every query names
-- the schema, so a caller's search_path never matters. The name written here
-- is the default: migrate() writes the schema chosen at run time
-- (JOBRUN_SCHEMA) in its place.

CREATE SCHEMA IF NOT EXISTS jobrun;

CREATE TYPE jobrun.job_state AS ENUM ('queued', 'leased', 'succeeded', 'dead', 'cancelled');

-- fillfactor 85 leaves room on each heap page so that the frequent
-- lease-extending UPDATEs (heartbeats) can stay HOT: a HOT update writes no
-- index entries at all.
CREATE TABLE jobrun.jobs (
    id               uuid        PRIMARY KEY,          -- assigned by the client, UUIDv7 (time-ordered)
    queue            text        NOT NULL,
    type             text        NOT NULL,
    payload          jsonb       NOT NULL,
    priority         integer     NOT NULL DEFAULT 0,   -- lower runs first
    state            jobrun.job_state NOT NULL DEFAULT 'queued',
    attempts         integer     NOT NULL DEFAULT 0,   -- claims so far; a claim burns one
    max_attempts     integer     NOT NULL DEFAULT 25,
    backoff          jsonb       NOT NULL,             -- the retry policy, see jobrun.job.Backoff
    run_at           timestamptz NOT NULL DEFAULT now(),
    lease_owner      text,
    lease_token      uuid,                             -- the fence: new on every claim
    lease_expires_at timestamptz,
    cancel_requested boolean     NOT NULL DEFAULT false,
    idempotency_key  text,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,

    CONSTRAINT jobs_attempts_range CHECK (attempts >= 0),
    CONSTRAINT jobs_max_attempts_range CHECK (max_attempts >= 1),
    -- A leased job always carries its whole lease; any other state carries none.
    CONSTRAINT jobs_lease_matches_state CHECK (
        (state = 'leased') = (lease_owner IS NOT NULL AND lease_token IS NOT NULL
                              AND lease_expires_at IS NOT NULL)
        AND (state <> 'leased') = (lease_owner IS NULL AND lease_token IS NULL
                                   AND lease_expires_at IS NULL)
    ),
    -- finished_at is set exactly when the job is terminal.
    CONSTRAINT jobs_finished_matches_state CHECK (
        (state IN ('succeeded', 'dead', 'cancelled')) = (finished_at IS NOT NULL)
    )
) WITH (fillfactor = 85);

-- Idempotent enqueue: the ON CONFLICT target of InsertJob.
CREATE UNIQUE INDEX jobs_idem_uniq ON jobrun.jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The claim: queued jobs of a queue in priority, run_at order. Only queued
-- rows are in it, so it stays small however many finished rows the table holds.
CREATE INDEX jobs_claim_idx ON jobrun.jobs (queue, priority, run_at, id)
    WHERE state = 'queued';

-- The expired-lease scan (ReapExpired). Deliberately NOT an index on
-- lease_expires_at: heartbeats rewrite that column constantly, and an index
-- containing it makes every heartbeat a non-HOT update (a new entry in every
-- index of the table). This index holds only leased rows (a few per worker
-- thread) and its key and predicate use columns that heartbeats never change,
-- so heartbeats stay HOT; the reaper reads the leased rows through it and
-- filters lease_expires_at on the heap.
--
-- Measured (bench/hot_heartbeats.py: PostgreSQL 18, 2,000 leased jobs among
-- 100,000 rows, 20,000 heartbeat updates of lease_expires_at, fillfactor 85):
--   index on (lease_expires_at) WHERE state = 'leased': 0 of 20,000 updates HOT (0.0%)
--   this index, on (id) WHERE state = 'leased':      19,999 of 20,000 HOT (100.0%)
-- The price is the reaper's scan: 0.28 ms instead of 0.06 ms over 2,000 leased
-- rows, once every few seconds. tests/postgres/test_store_leases.py
-- (test_heartbeats_are_hot_updates) keeps the HOT half true.
CREATE INDEX jobs_leased_idx ON jobrun.jobs (id) WHERE state = 'leased';

-- Purge of finished jobs by age.
CREATE INDEX jobs_finished_at_idx ON jobrun.jobs (finished_at) WHERE finished_at IS NOT NULL;

-- The audit trail. No foreign key to jobs: purge and prune run on their own
-- schedules, and an FK would make every event insert take a KEY SHARE lock on
-- the job row (a classic deadlock source between batch updates and inserts).
CREATE TABLE jobrun.job_events (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id  uuid        NOT NULL,
    kind    text        NOT NULL,
    attempt integer     NOT NULL DEFAULT 0,
    at      timestamptz NOT NULL DEFAULT now(),
    detail  jsonb
);
CREATE INDEX job_events_job_idx ON jobrun.job_events (job_id, id);
CREATE INDEX job_events_at_idx ON jobrun.job_events (at);

-- The effect ledger of the transactional path: a row here means the handler's
-- commit callable for (scope, key) has committed, exactly once.
CREATE TABLE jobrun.processed_effects (
    scope      text        NOT NULL,
    key        text        NOT NULL,
    job_id     uuid        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

-- Cron schedules and the template of the job each occurrence enqueues.
CREATE TABLE jobrun.schedules (
    id           text        PRIMARY KEY,
    cron         text        NOT NULL,
    timezone     text        NOT NULL DEFAULT 'UTC',
    queue        text        NOT NULL,
    type         text        NOT NULL,
    payload      jsonb       NOT NULL,
    priority     integer     NOT NULL DEFAULT 0,
    max_attempts integer     NOT NULL DEFAULT 25,
    backoff      jsonb       NOT NULL,
    next_run_at  timestamptz NOT NULL,
    paused       boolean     NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schedules_due_idx ON jobrun.schedules (next_run_at) WHERE NOT paused;
