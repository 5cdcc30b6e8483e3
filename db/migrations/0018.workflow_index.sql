-- depends: 0017.signals

-- Operating workflows (issue 29, item 7): a workflow's jobs found by its id.
--
-- jobs_workflow_idx: the jobs of one workflow, for listing a workflow with
-- its jobs counted by state, reading its graph, cancelling and retrying it,
-- and the purge's check that a workflow has no job left
-- (db/query/workflows.sql, PurgeJobs). Partial (WHERE workflow_id IS NOT
-- NULL): a job enqueued alone, most jobs, is not in it, so it costs them
-- nothing on insert and nothing on a state change (a HOT update: its one
-- column never changes). No claim reads it: the claim's plan stays on
-- jobs_claim_idx (tests/postgres/test_store_workflow_ops.py checks it).
--
-- workflows_created_idx: the list newest first, a page at a time (keyset on
-- created_at, id: a workflow's id is a UUIDv4, not time-ordered).
--
-- Locks and time. Migrations run in one transaction, so no CONCURRENTLY:
-- CREATE INDEX takes SHARE on jobs (reads go on; enqueues, claims and
-- completions wait) while it reads the whole table once, until the
-- migration commits. Measured on 1,000,000 jobs (537 MB: 100,000 queued,
-- 10,000 in 1,000 workflows) on a busy 2-core machine: the whole migration,
-- connection included, took 0.79 to 1.03 s (three runs), the CREATE INDEX
-- on jobs alone 0.63 s; it grows with the table (one sequential read of
-- it), about 1 s per million jobs. The claim's plan, custom and generic, is
-- the same before and after (jobs_claim_idx). The workflows index locks
-- only that table. A deployment that cannot stop its writes that long
-- creates jobs_workflow_idx beforehand, by hand, with CREATE INDEX
-- CONCURRENTLY and the same name and definition: IF NOT EXISTS then skips it.
CREATE INDEX IF NOT EXISTS jobs_workflow_idx ON jobrun.jobs (workflow_id)
    WHERE workflow_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS workflows_created_idx ON jobrun.workflows (created_at, id);

UPDATE jobrun.schema_version SET version = 18, at = now();
