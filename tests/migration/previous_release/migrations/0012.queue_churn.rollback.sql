UPDATE jobrun.schema_version SET version = 11, at = now();
ALTER TABLE jobrun.queue_starts RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
ALTER TABLE jobrun.job_events RESET (
    autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, autovacuum_vacuum_cost_limit
);
ALTER TABLE jobrun.jobs RESET (
    autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
    autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_limit
);
ALTER TABLE jobrun.jobs SET (fillfactor = 85);
CREATE INDEX jobs_leased_idx ON jobrun.jobs (id) WHERE state = 'leased';
