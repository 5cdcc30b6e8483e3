-- depends: 0002.queue_pauses

-- The claim that finished a job. Complete (one, many, or batched on the
-- transactional path) keeps the lease token of the claim that ended the job
-- here, so that a Complete retried after its COMMIT reply was lost is told
-- "done" only when it carries that very claim's token. State and attempt
-- count cannot tell claims apart: an operator's Retry resets attempts, and a
-- later claim then finishes at the same count (a stale owner must get
-- LeaseLost there, never success). Retry clears it with the rest of the
-- finished job's state. Only Complete sets it: reaped and failed jobs carry
-- none.
ALTER TABLE jobrun.jobs ADD COLUMN finished_token uuid;

ALTER TABLE jobrun.jobs ADD CONSTRAINT jobs_finished_token_matches_state CHECK (
    finished_token IS NULL OR state IN ('succeeded', 'cancelled')
);
