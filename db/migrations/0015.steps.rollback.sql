UPDATE jobrun.schema_version SET version = 14, at = now();
DROP TABLE jobrun.job_fences;
DROP TABLE jobrun.job_steps;
