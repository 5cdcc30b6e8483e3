UPDATE jobrun.schema_version SET version = 10, at = now();
ALTER TABLE jobrun.jobs DROP CONSTRAINT jobs_releases_range;
ALTER TABLE jobrun.jobs DROP COLUMN releases;
