DROP TABLE schedules;
DROP TABLE processed_effects;
DROP TABLE job_events;
DROP TABLE jobs;
DROP TYPE job_state;
