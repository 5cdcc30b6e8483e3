UPDATE jobrun.schema_version SET version = 9, at = now();
ALTER TABLE jobrun.jobs DROP COLUMN started_at;
