-- depends: 0016.workflows

-- Durable sleeps and signals (issue 29, item 5).
--
-- job_waits: a durable wait a job has begun (ctx.sleep, ctx.wait_for_signal),
-- one row per wait step, written by the attempt holding the job's lease (the
-- statement holds the job row FOR SHARE with owner and token matched). until
-- is when the wait ends (a sleep's wake-up, a signal wait's timeout), computed
-- by the database clock on the wait's first run and never moved by a later
-- one; signal is the name waited for (NULL for a sleep). A waiting job leaves
-- its handler and is queued again with run_at = until and no lease, so that
-- nothing (thread, connection, lease) is held while it waits. The row goes
-- when the wait ends: its outcome is then a step of job_steps (the payload
-- received, the timeout, the sleep done), which a retried attempt replays.
--
-- job_signals: every signal sent to a job (client.signal, jobrun signal), kept
-- until the job is purged. (job_id, name, key) is the primary key: a signal
-- sent twice with the same key is stored, and delivered, once. seq orders the
-- signals of one name: a wait takes the oldest one not delivered yet (FIFO, one
-- per wait). delivered_at and step say which wait took it. A signal sent
-- before its wait begins waits here for it; one sent while its job is parked
-- waiting for that name moves the job's run_at to now, in the transaction that
-- stores it (both that transaction and the one that parks a job lock the job
-- row first, so neither misses the other).
--
-- No foreign key to jobs (as job_steps): PurgeJobs deletes both tables' rows
-- in its own statement; a job that never waits writes nothing here and its
-- updates pay for no trigger.
--
-- Locks: CREATE TABLE of two new tables only; nothing here reads, locks or
-- rewrites jobs, so the migration takes as long at 1,000,000 jobs as on none.
CREATE TABLE jobrun.job_waits (
    job_id      uuid        NOT NULL,
    step        text        NOT NULL,
    signal      text,
    until       timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, step),
    CONSTRAINT job_waits_step_length CHECK (length(step) BETWEEN 1 AND 200),
    CONSTRAINT job_waits_signal_length CHECK (length(signal) BETWEEN 1 AND 200)
);

CREATE TABLE jobrun.job_signals (
    job_id        uuid        NOT NULL,
    name          text        NOT NULL,
    key           text        NOT NULL,
    payload       jsonb,
    seq           int8        GENERATED ALWAYS AS IDENTITY,
    sent_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at  timestamptz,
    step          text,
    PRIMARY KEY (job_id, name, key),
    CONSTRAINT job_signals_name_length CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT job_signals_key_length CHECK (length(key) BETWEEN 1 AND 200)
);

UPDATE jobrun.schema_version SET version = 17, at = now();
