-- depends: 0013.workers

-- job_events loses its primary key (issue 27). Every job writes three
-- events (enqueued, claimed, finished), and each entered two B-trees: the
-- primary key on id and job_events_job_idx (job_id, id). Nothing looks an
-- event up by its id alone: a job's timeline reads job_events_job_idx, the
-- last hour's failures and pruning by age read the BRIN index on `at`.
-- Measured (PostgreSQL 18, batches of 100 events as the worker writes
-- them): 287 bytes of WAL per event with the key, 221 without, so about
-- 200 bytes less per job drained, and one index insertion less per event.
-- id stays, an identity column, filled as before: the timeline's order.
--
-- PruneEvents took the oldest events first by walking that key; it now
-- deletes, by their row address, up to max_events events older than the
-- age as the BRIN index finds them (roughly the oldest pages first).
--
-- Locks: DROP CONSTRAINT takes ACCESS EXCLUSIVE on job_events (event
-- inserts queue behind it until the migration commits) and drops the
-- index's file at commit: a catalog change, nothing in it grows with the
-- table. The rollback builds the key again, holding its lock for the build
-- (about a second per few million events).
ALTER TABLE jobrun.job_events DROP CONSTRAINT job_events_pkey;

UPDATE jobrun.schema_version SET version = 14, at = now();
