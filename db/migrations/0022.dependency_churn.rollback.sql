-- job_dependencies fills its pages again (see 0022).
ALTER TABLE jobrun.job_dependencies RESET (fillfactor);
UPDATE jobrun.schema_version SET version = 21, at = now();
