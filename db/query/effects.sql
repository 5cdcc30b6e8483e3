-- The processed_effects ledger of the transactional path.

-- name: EffectDone :one
SELECT EXISTS (
    SELECT 1 FROM jobrun.processed_effects WHERE scope = sqlc.arg(scope) AND key = sqlc.arg(key)
) AS done;
