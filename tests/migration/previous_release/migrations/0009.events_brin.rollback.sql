DROP INDEX jobrun.job_events_at_idx;
CREATE INDEX job_events_at_idx ON jobrun.job_events (at);
UPDATE jobrun.schema_version SET version = 8, at = now();
