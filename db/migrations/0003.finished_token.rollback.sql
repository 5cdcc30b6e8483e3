ALTER TABLE jobs DROP CONSTRAINT jobs_finished_token_matches_state;
ALTER TABLE jobs DROP COLUMN finished_token;
