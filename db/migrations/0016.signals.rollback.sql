UPDATE jobrun.schema_version SET version = 15, at = now();
DROP TABLE jobrun.job_signals;
DROP TABLE jobrun.job_waits;
