UPDATE jobrun.schema_version SET version = 4, at = now();
ALTER TABLE jobrun.jobs DROP COLUMN notify_finished;
ALTER TABLE jobrun.jobs DROP COLUMN result;
