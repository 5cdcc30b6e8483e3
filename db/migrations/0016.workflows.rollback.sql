UPDATE jobrun.schema_version SET version = 15, at = now();
DROP TRIGGER jobs_release_dependents ON jobrun.jobs;
DROP FUNCTION jobrun.jobs_release_dependents();
DROP FUNCTION jobrun.parent_finished(uuid, jobrun.job_state);
DROP TABLE jobrun.job_dependencies;
DROP TABLE jobrun.workflows;
-- Jobs still waiting for parents run now: the state they are in is going.
UPDATE jobrun.jobs SET state = 'queued' WHERE state = 'waiting';
ALTER TABLE jobrun.jobs
    DROP COLUMN pending_parents,
    DROP COLUMN has_dependents,
    DROP COLUMN on_parent_failure,
    DROP COLUMN workflow_id,
    DROP COLUMN workflow_node;
-- PostgreSQL cannot drop an enum value: 'waiting' stays in job_state, unused
-- (ADD VALUE IF NOT EXISTS makes the forward migration re-runnable).
