DROP TABLE jobrun.schedules;
DROP TABLE jobrun.processed_effects;
DROP TABLE jobrun.job_events;
DROP TABLE jobrun.jobs;
DROP TYPE jobrun.job_state;
