DROP TABLE jobrun.schema_version;
