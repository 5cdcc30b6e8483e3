CREATE INDEX jobs_workflow_idx ON jobrun.jobs (workflow_id) WHERE workflow_id IS NOT NULL;
DROP TABLE jobrun.workflow_jobs;
UPDATE jobrun.schema_version SET version = 23, at = now();
