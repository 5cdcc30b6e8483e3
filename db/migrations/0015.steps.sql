-- depends: 0014.events_without_pkey

-- Durable steps and fencing tokens (issue 29, items 4 and 6).
--
-- job_steps: one row per step of a job that returned, written when it
-- returns (ctx.step) or in the transaction of its own database writes
-- (ctx.transaction_step), by the attempt holding the job's lease: the insert
-- locks the job row FOR SHARE with owner and token matched, so a stale
-- attempt (its lease reaped and claimed again) records nothing, and the
-- reaper (SKIP LOCKED) cannot take the job from under a checkpoint in flight.
-- A retried attempt reads the job's rows once, at its first step, and
-- returns the stored result of every step already there without running it
-- again. result is the step's value as JSON (the job result's encoding
-- rules), NULL for None.
-- The rows go with their job: PurgeJobs deletes them in its statement (no
-- foreign key: a key's triggers would tax every update of every job, for a
-- feature most jobs never use; only the lease holder of a job writes here,
-- and a job being purged has none). An operator's retry keeps them, so a
-- retried job resumes after its last recorded step.
--
-- job_fences: the last fencing token issued for a job. A handler that asks
-- for one (ctx.fencing_token) gets this number plus one, in a statement that
-- locks the job row FOR SHARE with its claim's owner and token matched: only
-- the attempt holding the lease gets a token, and each later run of the job
-- (after a lease expiry, a failure, a snooze, an operator's retry) gets a
-- greater one. A downstream store that keeps the greatest token it has seen
-- refuses a stale claim's write. Issued on first use: a job that never asks
-- writes nothing here, and the claim statements are unchanged.
--
-- Locks: CREATE TABLE of two new tables only; nothing here reads, locks or
-- rewrites jobs, so the migration takes as long at 1,000,000 jobs as on an
-- empty database.
CREATE TABLE jobrun.job_steps (
    job_id      uuid        NOT NULL,
    name        text        NOT NULL,
    attempt     int4        NOT NULL,
    result      jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name),
    CONSTRAINT job_steps_name_length CHECK (length(name) BETWEEN 1 AND 200)
);

CREATE TABLE jobrun.job_fences (
    job_id  uuid  PRIMARY KEY,
    token   int8  NOT NULL CONSTRAINT job_fences_token_positive CHECK (token > 0)
);

UPDATE jobrun.schema_version SET version = 15, at = now();
