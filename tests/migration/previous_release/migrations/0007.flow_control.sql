-- depends: 0006.observability

-- Flow control (issue 14): limits every worker agrees on, because they live
-- here and the claim reads them, and what a handler reports while it runs.
--
-- queue_limits: at most `concurrency` jobs of the queue leased at once, at
-- most `per_key` leased at once for each concurrency key, at most
-- `rate_limit` jobs claimed in any window of `rate_period_seconds` (by the
-- database clock). NULL: no such limit. A claim that takes jobs of a queue
-- listed here first locks the queue's row (FOR UPDATE, in a statement of its
-- own) and then counts with a fresh snapshot: claims of one limited queue
-- take turns, so the count they see is never stale and no limit is ever
-- overshot. Queues not listed here are claimed exactly as before, lock-free.
CREATE TABLE jobrun.queue_limits (
    queue               text        PRIMARY KEY,
    concurrency         integer,
    per_key             integer,
    rate_limit          integer,
    rate_period_seconds float8,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queue_limits_concurrency_range CHECK (concurrency >= 1),
    CONSTRAINT queue_limits_per_key_range CHECK (per_key >= 1),
    CONSTRAINT queue_limits_rate_range CHECK (rate_limit >= 1 AND rate_period_seconds > 0),
    CONSTRAINT queue_limits_rate_whole CHECK ((rate_limit IS NULL) = (rate_period_seconds IS NULL)),
    CONSTRAINT queue_limits_some_limit CHECK (
        concurrency IS NOT NULL OR per_key IS NOT NULL OR rate_limit IS NOT NULL
    )
);

-- The rate limit's sliding window: one row per claim of a rate-limited
-- queue (how many jobs it started, when). A claim may start
-- rate_limit - sum(jobs) over the last rate_period_seconds; rows older than
-- the window are deleted by the claims themselves.
CREATE TABLE jobrun.queue_starts (
    queue text        NOT NULL,
    at    timestamptz NOT NULL,
    jobs  integer     NOT NULL
);
CREATE INDEX queue_starts_queue_at_idx ON jobrun.queue_starts (queue, at);

-- A job's concurrency key (a tenant, an account): with a per_key limit on
-- its queue, at most that many jobs with the same key are leased at once.
ALTER TABLE jobrun.jobs ADD COLUMN concurrency_key text;

-- Leased jobs per queue and key: what a limited claim counts. Heartbeats
-- change none of these columns, so they stay HOT updates.
CREATE INDEX jobs_leased_queue_idx ON jobrun.jobs (queue, concurrency_key)
    WHERE state = 'leased';

-- Snoozes: a handler asked to run again later. The attempt its claim burned
-- is given back; this counts the snoozes instead.
ALTER TABLE jobrun.jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
ALTER TABLE jobrun.jobs ADD CONSTRAINT jobs_snoozes_range CHECK (snoozes >= 0);

-- Progress a running handler reported (a fraction from 0 to 1, a message,
-- when by the database clock). Not indexed: its updates stay HOT.
ALTER TABLE jobrun.jobs ADD COLUMN progress float8;
ALTER TABLE jobrun.jobs ADD COLUMN progress_message text;
ALTER TABLE jobrun.jobs ADD COLUMN progress_at timestamptz;
ALTER TABLE jobrun.jobs ADD CONSTRAINT jobs_progress_range CHECK (progress >= 0 AND progress <= 1);

UPDATE jobrun.schema_version SET version = 7, at = now();
