-- Durable steps and fencing tokens (migration 0015), fenced by the claim.

-- name: LoadSteps :many
-- Every step of a job already recorded, read once by an attempt (at its
-- first step), never once per step.
SELECT steps.name, steps.attempt, steps.result
FROM jobrun.job_steps AS steps
WHERE steps.job_id = sqlc.arg(job_id)::uuid;

-- name: RecordStep :one
-- A step's checkpoint, written by the claim holding the job: held is false
-- when it does not (nothing written: the lease is lost). recorded is false
-- when the step was already there (never for a holder that read the steps
-- at its first step: a stale claim cannot record one after this claim).
-- result is the value as stored (as jsonb gives it back to a replay).
WITH lease AS (
    SELECT jobs.id FROM jobrun.jobs AS jobs
    WHERE jobs.id = sqlc.arg(job_id)::uuid AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.lease_token = sqlc.arg(token)::uuid
    FOR SHARE
), ins AS (
    INSERT INTO jobrun.job_steps (job_id, name, attempt, result)
    SELECT lease.id, sqlc.arg(name)::text, sqlc.arg(attempt)::int4, sqlc.narg(result)::jsonb
    FROM lease
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING job_steps.result
)
SELECT EXISTS (SELECT 1 FROM lease)::boolean AS held,
       EXISTS (SELECT 1 FROM ins)::boolean AS recorded,
       (SELECT ins.result FROM ins)::jsonb AS result;

-- name: HoldStepLease :one
-- The first statement of a transactional step: the job row locked FOR SHARE
-- when this claim holds it, until the transaction ends (a reap or a claim
-- of the job waits for the step's commit). No row back: the lease is lost.
SELECT jobs.id FROM jobrun.jobs AS jobs
WHERE jobs.id = sqlc.arg(job_id)::uuid AND jobs.state::text = 'leased'
  AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.lease_token = sqlc.arg(token)::uuid
FOR SHARE;

-- name: InsertStep :one
-- The last statement of a transactional step, after its writes, in their
-- transaction (the job row held since HoldStepLease); the value as stored.
-- No row back: the step was already recorded.
INSERT INTO jobrun.job_steps (job_id, name, attempt, result)
VALUES (sqlc.arg(job_id)::uuid, sqlc.arg(name)::text, sqlc.arg(attempt)::int4,
        sqlc.narg(result)::jsonb)
ON CONFLICT (job_id, name) DO NOTHING
RETURNING job_steps.job_id, job_steps.result;

-- name: IssueFencingToken :one
-- A new fencing token for the claim holding the job: one more than the last
-- one issued for the job. No row back: the claim does not hold the job.
-- The job row is held FOR SHARE until this commits, so a later claim (which
-- must update that row) gets its token after this one, and a greater one.
WITH lease AS (
    SELECT jobs.id FROM jobrun.jobs AS jobs
    WHERE jobs.id = sqlc.arg(job_id)::uuid AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.lease_token = sqlc.arg(token)::uuid
    FOR SHARE
)
INSERT INTO jobrun.job_fences (job_id, token)
SELECT lease.id, 1 FROM lease
ON CONFLICT (job_id) DO UPDATE SET token = job_fences.token + 1
RETURNING job_fences.token;
