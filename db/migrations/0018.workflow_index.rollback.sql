UPDATE jobrun.schema_version SET version = 17, at = now();
DROP INDEX jobrun.workflows_created_idx;
DROP INDEX jobrun.jobs_workflow_idx;
