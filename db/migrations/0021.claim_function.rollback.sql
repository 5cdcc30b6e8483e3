-- ClaimJobs of 0020 plans its statement itself again (see 0021).
DROP FUNCTION jobrun.claim_jobs(text[], text, int8, int8, float8, boolean);
UPDATE jobrun.schema_version SET version = 20, at = now();
