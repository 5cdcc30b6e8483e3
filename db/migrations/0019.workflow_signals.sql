-- depends: 0018.workflow_index

-- Signals sent to a workflow (issue 29, item 5: client.signal(workflow_id, ...)).
--
-- workflow_signals: every signal sent to a workflow id, kept until the
-- workflow's last job is purged. (workflow_id, name, key) is the primary key:
-- the same (workflow, name, key) sent twice is stored once. A workflow signal
-- is for every job of the workflow that waits (now or later) for its name,
-- each such job receiving it once: so it is never "delivered" as a whole,
-- and each delivery is a row of
--
-- workflow_signal_deliveries: (job_id, name, key) says that this job took
-- this signal of its workflow, in which wait step and when. The primary key
-- is what makes delivery exact: a job's wait inserts its row in the same
-- statement that records the payload as its step (fenced by the job's claim),
-- and a second insert of the same row is refused.
--
-- A job's wait for a name takes the oldest signal of that name not delivered
-- to it, whether sent to the job (job_signals) or to its workflow (here):
-- seq draws from job_signals' own sequence, so that one order covers both
-- tables (by seq, as job signals alone were ordered).
--
-- Racing a park: a workflow signal's transaction locks the workflow's row
-- (FOR UPDATE) before it stores the signal and wakes the parked jobs; a park
-- of a workflow's job in a signal wait locks the same row (FOR KEY SHARE, so
-- that parks do not wait for one another) before its job row. Whichever comes
-- second sees what the first committed: the park finds the signal (the job is
-- due at once) or the signal finds the job parked (and makes it due): never
-- neither. The order (workflow row, then job rows) is the same in both.
--
-- No foreign keys (as job_signals): PurgeJobs deletes a job's deliveries with
-- it, and a workflow's signals with its last job.
--
-- Locks: CREATE TABLE of two new tables only; nothing here reads, locks or
-- rewrites jobs, so the migration takes as long at 1,000,000 jobs as on none.
-- It does not depend on migration 0018 (the jobs.workflow_id index), which
-- the sending and purging queries use when it is there.

-- seq's default names job_signals' sequence, resolved now (to its oid) in the
-- schema of jobrun's tables, whatever its name: the search_path is set to it
-- for the CREATE TABLE (as 0016 does for its functions), then restored.
UPDATE jobrun.schema_version SET at = at
WHERE set_config('jobrun_migrate.search_path', current_setting('search_path'), true) IS NOT NULL;
UPDATE jobrun.schema_version SET at = at
WHERE set_config('search_path',
                 (SELECT format('%I, pg_catalog', n.nspname)
                  FROM pg_catalog.pg_namespace AS n
                  WHERE n.oid = (SELECT t.typnamespace FROM pg_catalog.pg_type AS t
                                 WHERE t.oid = pg_typeof(NULL::jobrun.job_state)::oid)),
                 true) IS NOT NULL;

CREATE TABLE jobrun.workflow_signals (
    workflow_id  uuid        NOT NULL,
    name         text        NOT NULL,
    key          text        NOT NULL,
    payload      jsonb,
    seq          int8        NOT NULL DEFAULT nextval('job_signals_seq_seq'::regclass),
    sent_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, name, key),
    CONSTRAINT workflow_signals_name_length CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT workflow_signals_key_length CHECK (length(key) BETWEEN 1 AND 200)
);

UPDATE jobrun.schema_version SET at = at
WHERE set_config('search_path', current_setting('jobrun_migrate.search_path'), true) IS NOT NULL;

CREATE TABLE jobrun.workflow_signal_deliveries (
    job_id        uuid        NOT NULL,
    name          text        NOT NULL,
    key           text        NOT NULL,
    step          text        NOT NULL,
    delivered_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name, key)
);

UPDATE jobrun.schema_version SET version = 19, at = now();
