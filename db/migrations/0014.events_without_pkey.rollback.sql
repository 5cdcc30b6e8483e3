UPDATE jobrun.schema_version SET version = 13, at = now();
ALTER TABLE jobrun.job_events ADD PRIMARY KEY (id);
