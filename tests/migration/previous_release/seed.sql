-- Jobs in every state, as a jobrun 0.1.0 deployment leaves them when it is
-- stopped for an upgrade. Written against the schema of the frozen
-- migrations beside this file (only their columns), in schema jobrun.
-- Adapt it when the frozen migrations are refreshed (CONTRIBUTING.md,
-- "Releasing"): it must keep every state and feature below.
--
-- Ids 00000000-0000-4000-8000-0000000000NN; backoff constant 0 s, so a
-- runnable job runs at once.

INSERT INTO jobrun.jobs (id, queue, type, payload, state, attempts, max_attempts, backoff,
                         run_at, lease_owner, lease_token, lease_expires_at, started_at,
                         idempotency_key, concurrency_key, last_error, result, finished_at,
                         finished_token, created_at, updated_at)
VALUES
    -- 01 queued, due: runs.
    ('00000000-0000-4000-8000-000000000001', 'default', 'up.run', '{"n": 1}', 'queued', 0, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, now() - interval '1 minute', now() - interval '1 minute'),
    -- 02 scheduled an hour ahead: stays queued, its run_at kept.
    ('00000000-0000-4000-8000-000000000002', 'default', 'up.run', '{"n": 2}', 'queued', 0, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() + interval '1 hour', NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, now() - interval '1 minute', now() - interval '1 minute'),
    -- 03 running on a 0.1.0 worker stopped for the upgrade: its lease ran out.
    ('00000000-0000-4000-8000-000000000003', 'default', 'up.run', '{"n": 3}', 'leased', 1, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', 'host-a:4242:0.1.0', gen_random_uuid(),
     now() - interval '5 seconds', now() - interval '40 seconds',
     NULL, NULL, NULL, NULL, NULL, NULL, now() - interval '1 minute', now() - interval '40 seconds'),
    -- 04 failed once, queued again for its second attempt (retrying).
    ('00000000-0000-4000-8000-000000000004', 'default', 'up.run', '{"n": 4}', 'queued', 1, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 second', NULL, NULL, NULL, NULL,
     NULL, NULL, 'RuntimeError: the service was warming up', NULL, NULL, NULL,
     now() - interval '1 minute', now() - interval '1 second'),
    -- 05 succeeded, with its result and its effect in the ledger.
    ('00000000-0000-4000-8000-000000000005', 'default', 'up.run', '{"n": 5}', 'succeeded', 1, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', NULL, NULL, NULL, now() - interval '50 seconds',
     NULL, NULL, NULL, '{"done": 5}', now() - interval '49 seconds', gen_random_uuid(),
     now() - interval '1 minute', now() - interval '49 seconds'),
    -- 06 dead: its attempts used up.
    ('00000000-0000-4000-8000-000000000006', 'default', 'up.run', '{"n": 6}', 'dead', 3, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', NULL, NULL, NULL, now() - interval '30 seconds',
     NULL, NULL, 'RuntimeError: boom', NULL, now() - interval '29 seconds', NULL,
     now() - interval '1 minute', now() - interval '29 seconds'),
    -- 07 cancelled before it ran.
    ('00000000-0000-4000-8000-000000000007', 'default', 'up.run', '{"n": 7}', 'cancelled', 0, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, now() - interval '20 seconds', NULL,
     now() - interval '1 minute', now() - interval '20 seconds'),
    -- 08 queued under an idempotency key: runs, and the key stays taken.
    ('00000000-0000-4000-8000-000000000008', 'default', 'up.run', '{"n": 8}', 'queued', 0, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', NULL, NULL, NULL, NULL,
     'order-8', NULL, NULL, NULL, NULL, NULL, now() - interval '1 minute', now() - interval '1 minute'),
    -- 09-0c a limited queue (see queue_limits below), two jobs per concurrency key.
    ('00000000-0000-4000-8000-000000000009', 'limited', 'up.limited', '{"n": 9}', 'queued', 0, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', NULL, NULL, NULL, NULL,
     NULL, 'tenant-a', NULL, NULL, NULL, NULL, now() - interval '1 minute', now() - interval '1 minute'),
    ('00000000-0000-4000-8000-00000000000a', 'limited', 'up.limited', '{"n": 10}', 'queued', 0, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', NULL, NULL, NULL, NULL,
     NULL, 'tenant-a', NULL, NULL, NULL, NULL, now() - interval '1 minute', now() - interval '1 minute'),
    ('00000000-0000-4000-8000-00000000000b', 'limited', 'up.limited', '{"n": 11}', 'queued', 0, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', NULL, NULL, NULL, NULL,
     NULL, 'tenant-b', NULL, NULL, NULL, NULL, now() - interval '1 minute', now() - interval '1 minute'),
    ('00000000-0000-4000-8000-00000000000c', 'limited', 'up.limited', '{"n": 12}', 'queued', 0, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', NULL, NULL, NULL, NULL,
     NULL, 'tenant-b', NULL, NULL, NULL, NULL, now() - interval '1 minute', now() - interval '1 minute'),
    -- 0d queued on a paused queue: stays queued.
    ('00000000-0000-4000-8000-00000000000d', 'paused', 'up.run', '{"n": 13}', 'queued', 0, 3,
     '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
     now() - interval '1 minute', NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, now() - interval '1 minute', now() - interval '1 minute');

INSERT INTO jobrun.job_events (job_id, kind, attempt, at)
SELECT id, 'enqueued', 0, created_at FROM jobrun.jobs;
INSERT INTO jobrun.job_events (job_id, kind, attempt, at, detail) VALUES
    ('00000000-0000-4000-8000-000000000003', 'claimed', 1, now() - interval '40 seconds', NULL),
    ('00000000-0000-4000-8000-000000000004', 'retrying', 1, now() - interval '1 second',
     '{"error": "RuntimeError: the service was warming up"}'),
    ('00000000-0000-4000-8000-000000000005', 'succeeded', 1, now() - interval '49 seconds', NULL),
    ('00000000-0000-4000-8000-000000000006', 'dead', 3, now() - interval '29 seconds',
     '{"error": "RuntimeError: boom"}'),
    ('00000000-0000-4000-8000-000000000007', 'cancelled', 0, now() - interval '20 seconds', NULL);

INSERT INTO jobrun.processed_effects (scope, key, job_id)
VALUES ('job:up.run', '00000000-0000-4000-8000-000000000005', '00000000-0000-4000-8000-000000000005');

INSERT INTO jobrun.queue_limits (queue, concurrency, per_key) VALUES ('limited', 2, 1);
INSERT INTO jobrun.queue_pauses (queue) VALUES ('paused');

-- A daily schedule whose occurrence fell due while no scheduler ran (fires once here).
INSERT INTO jobrun.schedules (id, cron, timezone, queue, type, payload, max_attempts, backoff,
                              next_run_at)
VALUES ('up-nightly', '0 3 * * *', 'UTC', 'default', 'up.cron', '{"from": "schedule"}', 3,
        '{"kind": "constant", "base": 0.0, "factor": 2.0, "max_delay": 3600.0, "jitter": 0.0}',
        now() - interval '30 seconds');
