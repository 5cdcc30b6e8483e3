UPDATE jobrun.schema_version SET version = 5, at = now();
ALTER TABLE jobrun.schedules DROP COLUMN last_fired_at;
DROP INDEX jobrun.jobs_dead_idx;
ALTER TABLE jobrun.jobs DROP COLUMN trace_context;
