-- depends: 0010.attempt_start

-- How many times a worker released the job back to its queue without
-- running it (no handler for its type), each release giving its attempt
-- back (issue 26). The worker stops releasing after unknown_type_releases
-- and fails the job dead; it used to read the count back from last_error's
-- prose with a pattern, which a changed message or a translated log would
-- break. Snoozes are counted apart (snoozes).
--
-- A constant default: the ALTER changes the catalog only (no rewrite).
-- Never indexed: the release update stays HOT.
--
-- Jobs queued at upgrade after releases keep their count from last_error's
-- prose once, here, so an upgrade does not give them a fresh allowance.
ALTER TABLE jobrun.jobs ADD COLUMN releases integer NOT NULL DEFAULT 0;
ALTER TABLE jobrun.jobs ADD CONSTRAINT jobs_releases_range CHECK (releases >= 0);
UPDATE jobrun.jobs
SET releases = substring(last_error FROM
        '^no handler for job type ''[^'']*'' \(release ([0-9]{1,5}) of [0-9]+, attempt not counted\)')::integer
WHERE state = 'queued'
  AND last_error ~ '^no handler for job type ''[^'']*'' \(release [0-9]{1,5} of [0-9]+, attempt not counted\)';

UPDATE jobrun.schema_version SET version = 11, at = now();
