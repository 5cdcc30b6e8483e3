ALTER TABLE jobrun.jobs DROP CONSTRAINT jobs_finished_token_matches_state;
ALTER TABLE jobrun.jobs DROP COLUMN finished_token;
