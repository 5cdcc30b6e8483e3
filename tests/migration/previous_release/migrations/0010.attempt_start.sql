-- depends: 0009.events_brin

-- An attempt counts when its handler starts, not when its job is leased
-- (issue 25). A worker may lease more jobs than it has free threads (the
-- jobs that ride along with a complete-and-claim wait for one); when its
-- process dies, the reaper used to count an attempt for each, so jobs with
-- few max_attempts went dead without ever running.
--
-- started_at: when the current lease's attempt started (its handler was
-- about to run), by the database clock; NULL while a leased job waits for a
-- thread. A claim sets it (and burns the attempt) for the jobs it starts at
-- once, StartJobs for the others before they run; the reaper requeues an
-- expired lease that never started with its attempts unchanged, and a
-- release gives the attempt back only when it was counted. Every claim
-- writes it afresh, so it means something only while the job is leased
-- (afterwards it is when the last claim's attempt started).
--
-- A nullable column without a default: the ALTER changes the catalog only
-- (no table rewrite, no scan; an ACCESS EXCLUSIVE lock held for a moment).
-- Never indexed: the claim and StartJobs updates stay HOT.
--
-- Leases taken by the code before this one counted their attempt at the
-- claim: they are marked started, so that the reaper counts them as it did.
ALTER TABLE jobrun.jobs ADD COLUMN started_at timestamptz;
UPDATE jobrun.jobs SET started_at = updated_at WHERE state = 'leased';

UPDATE jobrun.schema_version SET version = 10, at = now();
