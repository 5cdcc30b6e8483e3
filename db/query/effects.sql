-- The processed_effects ledger of the transactional path.

-- name: EffectDone :one
-- Whether the effect of a key committed: its ledger row, or, for the key of
-- a job without an idempotency key (its own id: no other job shares it),
-- that job's success. complete_many writes no ledger row for such a job
-- (CompleteJobs); Complete, which may run a commit callable, always does.
SELECT (
    EXISTS (
        SELECT 1 FROM jobrun.processed_effects
        WHERE scope = sqlc.arg(scope)::text AND key = sqlc.arg(key)::text
    )
    OR EXISTS (
        SELECT 1 FROM jobrun.jobs AS jobs
        WHERE jobs.id = (CASE WHEN sqlc.arg(key)::text
                                   ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                              THEN sqlc.arg(key)::text::uuid END)
          AND 'job:' || jobs.type = sqlc.arg(scope)::text
          AND jobs.idempotency_key IS NULL AND jobs.state = 'succeeded'
    )
)::boolean AS done;
