UPDATE jobrun.schema_version SET version = 12, at = now();
DROP TABLE jobrun.workers;
