-- Durable sleeps and signals (migration 0017): the waits of a job's handler,
-- fenced by the claim, and the signals sent to a job.

-- name: AwaitStep :one
-- One turn of a durable wait (a sleep when signal is NULL), by the claim
-- holding the job (held is false when it does not: nothing written). In one
-- statement: the oldest signal of that name not delivered to the job yet,
-- sent to the job (job_signals) or to its workflow (workflow_signals,
-- migration 0019; one seq orders both), is delivered to the wait (FIFO, one
-- per wait: a job signal's delivered_at is set, a workflow signal gets this
-- job's delivery row); else a wait begun by an earlier run whose until has
-- come ends (a sleep done, a signal wait timed out); either way the outcome
-- is recorded as the wait's step (result, replayed by later attempts) and
-- the wait's row goes. Otherwise the wait's row is written on its first run,
-- until = now() + seconds by the database clock, and kept as it is on a
-- later one: until (the deadline, never moved) and now come back, and the
-- caller parks the job (ParkJob). result is NULL when the wait goes on.
WITH lease AS (
    SELECT jobs.id, jobs.attempts, jobs.workflow_id FROM jobrun.jobs AS jobs
    WHERE jobs.id = sqlc.arg(job_id)::uuid AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.lease_token = sqlc.arg(token)::uuid
    FOR SHARE
), prior AS (
    SELECT waits.until FROM jobrun.job_waits AS waits, lease
    WHERE waits.job_id = lease.id AND waits.step = sqlc.arg(step)::text
), pick AS (
    SELECT c.workflow_id, c.key FROM (
        (SELECT NULL::uuid AS workflow_id, signals.key, signals.seq
         FROM jobrun.job_signals AS signals, lease
         WHERE signals.job_id = lease.id AND signals.name = sqlc.narg(signal)::text
           AND signals.delivered_at IS NULL
         ORDER BY signals.seq
         LIMIT 1)
        UNION ALL
        (SELECT ws.workflow_id, ws.key, ws.seq
         FROM jobrun.workflow_signals AS ws, lease
         WHERE ws.workflow_id = lease.workflow_id AND ws.name = sqlc.narg(signal)::text
           AND NOT EXISTS (SELECT 1 FROM jobrun.workflow_signal_deliveries AS d
                           WHERE d.job_id = lease.id AND d.name = ws.name AND d.key = ws.key)
         ORDER BY ws.seq
         LIMIT 1)
    ) AS c
    ORDER BY c.seq
    LIMIT 1
), to_job AS (
    UPDATE jobrun.job_signals AS signals
    SET delivered_at = now(), step = sqlc.arg(step)::text
    FROM pick
    WHERE pick.workflow_id IS NULL
      AND signals.job_id = sqlc.arg(job_id)::uuid AND signals.name = sqlc.narg(signal)::text
      AND signals.key = pick.key AND signals.delivered_at IS NULL
    RETURNING signals.key, signals.payload
), to_workflow AS (
    INSERT INTO jobrun.workflow_signal_deliveries (job_id, name, key, step)
    SELECT sqlc.arg(job_id)::uuid, sqlc.narg(signal)::text, pick.key, sqlc.arg(step)::text
    FROM pick WHERE pick.workflow_id IS NOT NULL
    ON CONFLICT (job_id, name, key) DO NOTHING
    RETURNING workflow_signal_deliveries.key
), delivered AS (
    SELECT to_job.key, to_job.payload, NULL::uuid AS workflow_id FROM to_job
    UNION ALL
    SELECT ws.key, ws.payload, ws.workflow_id
    FROM to_workflow, pick, jobrun.workflow_signals AS ws
    WHERE ws.workflow_id = pick.workflow_id AND ws.name = sqlc.narg(signal)::text
      AND ws.key = to_workflow.key
), ended AS (
    SELECT delivered.key, delivered.payload, delivered.workflow_id, false AS timed_out
    FROM delivered
    UNION ALL
    SELECT NULL::text, NULL::jsonb, NULL::uuid, sqlc.narg(signal)::text IS NOT NULL FROM prior
    WHERE prior.until <= now() AND NOT EXISTS (SELECT 1 FROM delivered)
), step AS (
    INSERT INTO jobrun.job_steps (job_id, name, attempt, result)
    SELECT sqlc.arg(job_id)::uuid, sqlc.arg(step)::text, sqlc.arg(attempt)::int4,
           jsonb_build_object('signal', sqlc.narg(signal)::text, 'key', ended.key,
                              'payload', ended.payload, 'timed_out', ended.timed_out,
                              'until', (SELECT prior.until FROM prior))
           || CASE WHEN ended.workflow_id IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('workflow_id', ended.workflow_id) END
    FROM ended
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING job_steps.result
), gone AS (
    DELETE FROM jobrun.job_waits AS waits
    WHERE waits.job_id = sqlc.arg(job_id)::uuid AND waits.step = sqlc.arg(step)::text
      AND EXISTS (SELECT 1 FROM ended)
), began AS (
    INSERT INTO jobrun.job_waits (job_id, step, signal, until)
    SELECT lease.id, sqlc.arg(step)::text, sqlc.narg(signal)::text,
           now() + make_interval(secs => sqlc.arg(seconds)::float8)
    FROM lease
    WHERE NOT EXISTS (SELECT 1 FROM prior) AND NOT EXISTS (SELECT 1 FROM delivered)
    RETURNING job_waits.until
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt, detail)
    SELECT lease.id,
           CASE WHEN ended.key IS NOT NULL THEN 'signal_delivered' ELSE 'wait_ended' END,
           lease.attempts,
           jsonb_build_object('step', sqlc.arg(step)::text, 'signal', sqlc.narg(signal)::text,
                              'key', ended.key, 'timed_out', ended.timed_out)
           || CASE WHEN ended.workflow_id IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('workflow_id', ended.workflow_id) END
    FROM ended, lease
    WHERE sqlc.arg(write_all)::boolean
)
SELECT EXISTS (SELECT 1 FROM lease)::boolean AS held,
       EXISTS (SELECT 1 FROM ended)::boolean AS ended,
       (SELECT step.result FROM step)::jsonb AS result,
       COALESCE((SELECT began.until FROM began), (SELECT prior.until FROM prior))::timestamptz
           AS until,
       now()::timestamptz AS now;

-- name: LockLease :one
-- The first statement of ParkJob's transaction: the job row locked, when this
-- claim holds it, until the transaction ends. A signal's transaction locks the
-- same row first (LockJob), so the next statement sees every signal committed
-- before it, and a signal committed after it finds the job parked. No row
-- back: the lease is lost.
SELECT jobs.id FROM jobrun.jobs AS jobs
WHERE jobs.id = sqlc.arg(job_id)::uuid AND jobs.state::text = 'leased'
  AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.lease_token = sqlc.arg(token)::uuid
FOR NO KEY UPDATE;

-- name: LockWorkflowForPark :one
-- The first statement of the park of a workflow's job in a signal wait
-- (before LockLease): its workflow's row, FOR KEY SHARE until the transaction
-- ends (parks of one workflow's jobs do not wait for one another). A
-- workflow signal's transaction locks the same row FOR UPDATE first
-- (LockWorkflowForSignal), so ParkJob sees every workflow signal committed before it,
-- and a workflow signal committed after it finds the job parked. The same
-- order (the workflow's row, then the job's) on both sides: no deadlock.
SELECT workflows.id FROM jobrun.workflows AS workflows
WHERE workflows.id = sqlc.arg(workflow_id)::uuid
FOR KEY SHARE;

-- name: ParkJob :one
-- Park a job in a durable wait (after LockLease, in its transaction): queued
-- again at the wait's until (now when a signal it waits for is there already,
-- sent to the job or to its workflow and not delivered to it: ready), its lease cleared and the attempt its start counted given back, as
-- a snooze does (not counted in snoozes: a wait is no snooze), with a
-- "parked" event. A job whose cancel was requested ends cancelled instead
-- (cancel wins), with its finish notification. No row back: the lease is lost.
WITH waiting AS (
    SELECT waits.signal, waits.until FROM jobrun.job_waits AS waits
    WHERE waits.job_id = sqlc.arg(job_id)::uuid AND waits.step = sqlc.arg(step)::text
), ready AS (
    SELECT 1 AS one FROM jobrun.job_signals AS signals, waiting
    WHERE signals.job_id = sqlc.arg(job_id)::uuid AND signals.name = waiting.signal
      AND signals.delivered_at IS NULL
    UNION ALL
    SELECT 1 FROM jobrun.workflow_signals AS ws, waiting, jobrun.jobs AS me
    WHERE me.id = sqlc.arg(job_id)::uuid AND ws.workflow_id = me.workflow_id
      AND ws.name = waiting.signal
      AND NOT EXISTS (SELECT 1 FROM jobrun.workflow_signal_deliveries AS d
                      WHERE d.job_id = me.id AND d.name = ws.name AND d.key = ws.key)
    LIMIT 1
), parked AS (
    UPDATE jobrun.jobs AS jobs
    SET state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END::jobrun.job_state,
        attempts = CASE WHEN cancel_requested OR started_at IS NULL THEN attempts
                        ELSE greatest(attempts - 1, 0) END,
        run_at = CASE WHEN cancel_requested THEN run_at
                      WHEN EXISTS (SELECT 1 FROM ready) THEN now()
                      ELSE greatest(COALESCE((SELECT waiting.until FROM waiting), now()), now())
                 END,
        finished_at = CASE WHEN cancel_requested THEN now() END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now()
    WHERE jobs.id = sqlc.arg(job_id)::uuid AND jobs.state::text = 'leased'
      AND jobs.lease_owner = sqlc.arg(owner)::text AND jobs.lease_token = sqlc.arg(token)::uuid
    RETURNING *
), ev AS (
    INSERT INTO jobrun.job_events (job_id, kind, attempt, detail)
    SELECT parked.id,
           CASE WHEN parked.state <> 'queued' THEN 'cancelled' ELSE 'parked' END,
           parked.attempts,
           jsonb_build_object('via', 'wait', 'step', sqlc.arg(step)::text,
                              'signal', (SELECT waiting.signal FROM waiting),
                              'until', (SELECT waiting.until FROM waiting),
                              'ready', EXISTS (SELECT 1 FROM ready))
    FROM parked
    WHERE sqlc.arg(write_all)::boolean OR parked.state <> 'queued'
), wake AS (
    SELECT pg_notify(sqlc.arg(finish_channel)::text, parked.id::text) FROM parked
    WHERE parked.state <> 'queued' AND parked.notify_finished
)
SELECT parked.*, EXISTS (SELECT 1 FROM ready)::boolean AS ready
FROM parked WHERE (SELECT count(*) FROM wake) >= 0;

-- name: SendSignal :one
-- The parked job is found by id with "state::text = 'queued'", out of reach
-- of jobs_claim_idx: analyzed with an empty queue, a plan through that index
-- read the whole backlog (as CompleteJobs' comment says of leases).
-- A signal stored for a job (after LockJob, in its transaction, the job not
-- finished): sent is false when one with the same (job, name, key) was
-- stored before (a duplicate: nothing written, delivered once). A job queued
-- and parked waiting for this name (its wait's row is there) is made due now:
-- woke_queue is its queue, for the caller's wake-up of the queue's workers.
WITH ins AS (
    INSERT INTO jobrun.job_signals (job_id, name, key, payload)
    VALUES (sqlc.arg(job_id)::uuid, sqlc.arg(name)::text, sqlc.arg(key)::text,
            sqlc.narg(payload)::jsonb)
    ON CONFLICT (job_id, name, key) DO NOTHING
    RETURNING job_signals.job_id
), woke AS (
    UPDATE jobrun.jobs AS jobs
    SET run_at = now(), updated_at = now()
    WHERE jobs.id = sqlc.arg(job_id)::uuid AND jobs.state::text = 'queued' AND jobs.run_at > now()
      AND EXISTS (SELECT 1 FROM ins)
      AND EXISTS (SELECT 1 FROM jobrun.job_waits AS waits
                  WHERE waits.job_id = sqlc.arg(job_id)::uuid
                    AND waits.signal = sqlc.arg(name)::text)
    RETURNING jobs.queue
)
SELECT EXISTS (SELECT 1 FROM ins)::boolean AS sent,
       (SELECT woke.queue FROM woke)::text AS woke_queue;

-- name: LockWorkflowForSignal :one
-- The first statement of a signal sent to a workflow (when the id is no
-- job's): its row, FOR UPDATE until the transaction ends, so that a park of
-- one of its jobs (LockWorkflowForPark) comes wholly before or after the
-- signal. No row back: no such workflow. unfinished counts its jobs not
-- finished (a workflow all of whose jobs finished takes no signal), and the
-- others its finished ones by state, for its WorkflowState.
WITH wf AS (
    SELECT workflows.id FROM jobrun.workflows AS workflows
    WHERE workflows.id = sqlc.arg(workflow_id)::uuid
    FOR UPDATE
), counts AS (
    SELECT count(*) FILTER (WHERE jobs.state NOT IN ('succeeded', 'dead', 'cancelled'))::int8
               AS unfinished,
           count(*) FILTER (WHERE jobs.state = 'succeeded')::int8 AS succeeded,
           count(*) FILTER (WHERE jobs.state = 'dead')::int8 AS dead,
           count(*) FILTER (WHERE jobs.state = 'cancelled')::int8 AS cancelled
    FROM wf
    JOIN jobrun.workflow_jobs AS m ON m.workflow_id = wf.id
    JOIN jobrun.jobs AS jobs ON jobs.id = m.job_id
)
SELECT wf.id, counts.unfinished, counts.succeeded, counts.dead, counts.cancelled
FROM wf, counts;

-- name: SendWorkflowSignal :many
-- A signal stored for a workflow (after LockWorkflowForSignal, in its transaction: its
-- own snapshot sees every park committed before the lock was granted). No
-- row back when one with the same (workflow, name, key) was stored before (a
-- duplicate: nothing written). Otherwise one row, with, for each job of the
-- workflow queued and parked waiting for this name (its wait's row is
-- there), made due now: its id, attempts and queue (the caller records
-- their events and wakes the queues' workers). Jobs are updated in id order.
WITH ins AS (
    INSERT INTO jobrun.workflow_signals (workflow_id, name, key, payload)
    VALUES (sqlc.arg(workflow_id)::uuid, sqlc.arg(name)::text, sqlc.arg(key)::text,
            sqlc.narg(payload)::jsonb)
    ON CONFLICT (workflow_id, name, key) DO NOTHING
    RETURNING workflow_signals.workflow_id
), parked AS (
    SELECT jobs.id FROM jobrun.workflow_jobs AS m
    JOIN jobrun.jobs AS jobs ON jobs.id = m.job_id
    WHERE m.workflow_id = sqlc.arg(workflow_id)::uuid AND jobs.state::text = 'queued'
      AND jobs.run_at > now()
      AND EXISTS (SELECT 1 FROM ins)
      AND EXISTS (SELECT 1 FROM jobrun.job_waits AS waits
                  WHERE waits.job_id = jobs.id AND waits.signal = sqlc.arg(name)::text)
    ORDER BY jobs.id
    FOR NO KEY UPDATE OF jobs
), woke AS (
    UPDATE jobrun.jobs AS jobs
    SET run_at = now(), updated_at = now()
    FROM parked
    WHERE jobs.id = parked.id AND jobs.state::text = 'queued' AND jobs.run_at > now()
    RETURNING jobs.id, jobs.attempts, jobs.queue
)
SELECT woke.id AS woke_id, woke.attempts AS woke_attempts, woke.queue AS woke_queue
FROM ins LEFT JOIN woke ON true;
