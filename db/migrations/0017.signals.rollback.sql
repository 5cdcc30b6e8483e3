UPDATE jobrun.schema_version SET version = 16, at = now();
DROP TABLE jobrun.job_signals;
DROP TABLE jobrun.job_waits;
