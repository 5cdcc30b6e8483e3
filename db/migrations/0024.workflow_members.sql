-- depends: 0023.release_trigger_new_rows

-- A workflow's jobs found through a table written once per job, not through
-- an index on jobs (issue 29, the cost per node; issue 27, fewer index
-- entries written per job).
--
-- Migration 0018's jobs_workflow_idx held every version of a workflow's
-- jobs: a change of state is never a HOT update (jobs_claim_idx's predicate
-- reads the state), so each one (the release, the claim, the completion)
-- wrote an entry into it as well as into the primary key. Measured on
-- PostgreSQL 15 (pg_stat_statements, statements of the drain only), the
-- bench's fan-out of 10,000 and 32 chains of 300, alternated, two runs
-- each: 120 and 130 us of server time per fan-out node with the index
-- against 107 and 108 without, 99 and 108 per chain node against 85 and 99.
--
-- jobrun.workflow_jobs holds one row per job of a workflow, inserted with
-- the job (InsertGraphJobs) and never updated; its primary key (workflow_id,
-- job_id) serves every read of a workflow's jobs in id order: listing and
-- counting them, its graph, cancel and retry, signals to it, and the purge's
-- check that a workflow has no job left, which deletes a job's row with the
-- job. No foreign key, as for the other tables of a job (migration 0015): no
-- update of jobs pays for a trigger. jobs.workflow_id stays: a job read alone
-- still names its workflow.
--
-- Locks and time. The copy of the workflow jobs' ids holds SHARE ROW
-- EXCLUSIVE on jobs from its start to the migration's commit: reads go on;
-- enqueues, claims and completions wait, so that no workflow enqueued
-- meanwhile is missed. It reads the workflow jobs through jobs_workflow_idx
-- before dropping it, and builds the primary key once they are copied:
-- measured on PostgreSQL 15 (2 cores), the whole `jobrun migrate` took 1.6 s
-- with 1,000,000 workflow jobs and 100,000 plain ones (jobs 333 MB; 4.7 s
-- with the key built row by row); plain jobs, however many, cost nothing.
-- DROP INDEX then takes ACCESS EXCLUSIVE on jobs for a catalog change, until
-- the commit.
LOCK TABLE jobrun.jobs IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE jobrun.workflow_jobs (
    workflow_id uuid NOT NULL,
    job_id uuid NOT NULL
);

INSERT INTO jobrun.workflow_jobs (workflow_id, job_id)
SELECT jobs.workflow_id, jobs.id FROM jobrun.jobs AS jobs WHERE jobs.workflow_id IS NOT NULL;

ALTER TABLE jobrun.workflow_jobs ADD PRIMARY KEY (workflow_id, job_id);

DROP INDEX jobrun.jobs_workflow_idx;

UPDATE jobrun.schema_version SET version = 24, at = now();
