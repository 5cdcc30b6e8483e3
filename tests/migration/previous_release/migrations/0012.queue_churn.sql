-- depends: 0011.release_count

-- Less written per job, and the churn of a queue's tables tuned where it
-- happens (issue 27): a drained job's row is updated twice (claimed,
-- finished), three times when it waited for a thread (started), and never
-- touched again until purged; its events and ledger rows are only inserted.
--
-- 1. jobs_leased_idx goes. The claim's new row version entered it and
--    jobs_leased_queue_idx, both indexes of the leased rows (a state change
--    is never a HOT update: state is in every partial index's predicate), so
--    every claim wrote one index entry more than it needs. Every reader of
--    leased rows (the reaper's expired leases, the dashboard's running
--    jobs, the limited claim's counts, the statistics) reads
--    jobs_leased_queue_idx: leased rows are a few per worker thread.
--
-- 2. Storage parameters, per table:
--    jobs: fillfactor 70 (was 85): a page keeps room for the new versions
--    of its rows' claim and completion, so fewer updates move the row to
--    another page (each such move also writes a lock record on the old page
--    and forgoes the WAL's prefix/suffix compression), and the start and
--    the heartbeats, which change no indexed column, can stay HOT. New rows
--    only: pages already filled keep what they hold. Autovacuum after 2 %
--    of the rows changed plus 1,000 (the default, 20 % plus 50, lets a
--    table of a million finished jobs collect 200,000 dead versions before
--    a vacuum), analyze after 5 %, and a cost limit of 2,000 (the default
--    200, with its 2 ms delay, keeps vacuum far behind a drain's churn).
--    job_events: inserted only, deleted in bulk by PruneEvents: vacuum
--    after 5 % deleted plus 1,000, at the same cost limit.
--    processed_effects: inserted only, never updated or deleted: the
--    defaults fit (fillfactor 100; an insert-driven vacuum now and then).
--    queue_starts: a handful of live rows, one inserted and the expired
--    ones deleted by every claim of a rate-limited queue: vacuumed after
--    every 500 dead rows whatever the table's size, so its index stays
--    small.
--
-- Locks. ALTER TABLE ... SET (...) of these parameters takes SHARE UPDATE
-- EXCLUSIVE (claims, completions, enqueues and reads go on; only other DDL
-- and VACUUM wait) and rewrites nothing: it changes the catalog only.
-- DROP INDEX takes ACCESS EXCLUSIVE on jobs: it waits for the transactions
-- using jobs (a Complete running a long commit callable included) and,
-- while it waits and until the migration commits, every statement on jobs
-- queues behind it. The drop itself is a catalog change (the index's file
-- goes at commit): measured on 1,000,000 jobs (220 MB: 100,000 queued,
-- 1,000 leased) on a busy 2-core machine, the whole migration held its
-- locks for 3 to 17 ms from its first statement to its commit, 90 ms once
-- (the commit's WAL flush); nothing in it grows with the table.
DROP INDEX jobrun.jobs_leased_idx;

ALTER TABLE jobrun.jobs SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_limit = 2000
);
ALTER TABLE jobrun.job_events SET (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_limit = 2000
);
ALTER TABLE jobrun.queue_starts SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 500
);

UPDATE jobrun.schema_version SET version = 12, at = now();
