UPDATE jobrun.schema_version SET version = 7, at = now();
DROP TABLE jobrun.leader;
