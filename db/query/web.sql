-- The web dashboard's reads (jobrun.postgres.web runs them, nothing else
-- does). Its actions are not here: they go through the Store's own methods
-- (cancel, retry, pause/resume, schedules), with their normal events.
--
-- The jobs table holds the whole history (a million finished rows is
-- ordinary), so no statement here may read it by a sequential scan
-- (tests/web/test_web_queries.py EXPLAINs them on a table of many finished
-- rows):
--
-- * A jobs page is keyset-paged by id, newest first: the page bound and the
--   id-prefix filter are ONE range on the primary key (id_low .. id_high, both
--   always given), an index condition in every plan, custom or generic, so
--   that page 1,000 costs what page 1 costs. There is no OFFSET anywhere.
-- * The states with a partial index (queued, leased, dead) have a query of
--   their own with the state written as a literal: a plan for "state = $1"
--   (the generic plan psycopg's prepared statements may get) can never use a
--   partial index, because the planner cannot prove its predicate from a
--   parameter. The other states (succeeded, cancelled), and no state, are
--   read along the primary key by a bounded scan (WebScanJobs): a filter
--   that matches few rows (cancelled, a rare type) would otherwise make a
--   sequential scan the planner's cheapest plan.
-- * Filters that may be absent are "(narg IS NULL OR column = narg)": they
--   are filters on rows the index already bounds, never the access path.

-- name: WebScanJobs :one
-- Any state (or none), with filters no index holds: a bounded scan. It reads
-- at most scan_rows jobs backwards along the primary key from the page bound
-- (the LIMIT inside the CTE keeps the filters from being pushed under it, so
-- the plan is that index scan whatever the filters: a filter that matches
-- nothing costs scan_rows rows, never the whole table) and returns the ids of
-- the matching ones, newest first, at most max_rows; how many rows it read
-- and the oldest of them, where the next page resumes when the scan ran out
-- before the page filled. The jobs themselves are then read by id.
WITH scanned AS (
    SELECT jobs.id, jobs.state, jobs.queue, jobs.type
    FROM jobrun.jobs AS jobs
    WHERE jobs.id BETWEEN sqlc.arg(id_low)::uuid AND sqlc.arg(id_high)::uuid
    ORDER BY jobs.id DESC
    LIMIT sqlc.arg(scan_rows)
)
SELECT (SELECT count(*) FROM scanned)::int8 AS scanned,
       COALESCE((SELECT s.id FROM scanned AS s ORDER BY s.id LIMIT 1),
                sqlc.arg(id_low)::uuid)::uuid AS oldest_scanned,
       ARRAY(
           SELECT s.id FROM scanned AS s
           WHERE (sqlc.narg(state)::jobrun.job_state IS NULL
                  OR s.state = sqlc.narg(state)::jobrun.job_state)
             AND (sqlc.narg(queue)::text IS NULL OR s.queue = sqlc.narg(queue)::text)
             AND (sqlc.narg(type)::text IS NULL OR s.type = sqlc.narg(type)::text)
           ORDER BY s.id DESC
           LIMIT sqlc.arg(max_rows)
       )::uuid[] AS ids;

-- name: WebQueuedJobsPage :many
-- Queued jobs (jobs_claim_idx holds every one of them, and only them).
SELECT * FROM jobrun.jobs AS jobs
WHERE jobs.state = 'queued'
  AND jobs.id BETWEEN sqlc.arg(id_low)::uuid AND sqlc.arg(id_high)::uuid
  AND (sqlc.narg(queue)::text IS NULL OR jobs.queue = sqlc.narg(queue)::text)
  AND (sqlc.narg(type)::text IS NULL OR jobs.type = sqlc.narg(type)::text)
ORDER BY jobs.id DESC
LIMIT sqlc.arg(max_rows);

-- name: WebLeasedJobsPage :many
-- Leased jobs (jobs_leased_queue_idx: a few per worker thread).
SELECT * FROM jobrun.jobs AS jobs
WHERE jobs.state = 'leased'
  AND jobs.id BETWEEN sqlc.arg(id_low)::uuid AND sqlc.arg(id_high)::uuid
  AND (sqlc.narg(queue)::text IS NULL OR jobs.queue = sqlc.narg(queue)::text)
  AND (sqlc.narg(type)::text IS NULL OR jobs.type = sqlc.narg(type)::text)
ORDER BY jobs.id DESC
LIMIT sqlc.arg(max_rows);

-- name: WebDeadJobsPage :many
-- Dead jobs (jobs_dead_idx: the queue of every dead job, none of the others).
SELECT * FROM jobrun.jobs AS jobs
WHERE jobs.state = 'dead'
  AND jobs.id BETWEEN sqlc.arg(id_low)::uuid AND sqlc.arg(id_high)::uuid
  AND (sqlc.narg(queue)::text IS NULL OR jobs.queue = sqlc.narg(queue)::text)
  AND (sqlc.narg(type)::text IS NULL OR jobs.type = sqlc.narg(type)::text)
ORDER BY jobs.id DESC
LIMIT sqlc.arg(max_rows);

-- name: WebKeyedJobsPage :many
-- Jobs with this idempotency key (jobs_idem_uniq: "key = $1" implies its
-- predicate "key IS NOT NULL", so even the generic plan can use it). A key
-- is unique per queue: a handful of rows at most.
SELECT * FROM jobrun.jobs AS jobs
WHERE jobs.idempotency_key = sqlc.arg(idempotency_key)::text
  AND jobs.id BETWEEN sqlc.arg(id_low)::uuid AND sqlc.arg(id_high)::uuid
  AND (sqlc.narg(state)::jobrun.job_state IS NULL
       OR jobs.state = sqlc.narg(state)::jobrun.job_state)
  AND (sqlc.narg(queue)::text IS NULL OR jobs.queue = sqlc.narg(queue)::text)
  AND (sqlc.narg(type)::text IS NULL OR jobs.type = sqlc.narg(type)::text)
ORDER BY jobs.id DESC
LIMIT sqlc.arg(max_rows);

-- name: WebThroughput :many
-- Jobs succeeded and attempts failed in each of the last 60 minutes (by the
-- database clock), oldest minute first, zeros included. Successes are read
-- from jobs_finished_at_idx (finished in the last hour), failures from
-- job_events_at_idx: 'retrying' and 'dead' events, and a lease the reaper
-- took back into the queue ('reaped' whose verdict is queued; a reaped job
-- that died also has its 'dead' event). With JOB_EVENTS=terminal only the
-- 'dead' events are recorded, so only those failures are counted.
WITH bounds AS (
    SELECT date_trunc('minute', now()) - interval '59 minutes' AS first_minute
), minutes AS (
    SELECT generate_series(bounds.first_minute, bounds.first_minute + interval '59 minutes',
                           interval '1 minute') AS minute
    FROM bounds
), done AS (
    SELECT date_trunc('minute', jobs.finished_at) AS minute, count(*) AS n
    FROM jobrun.jobs AS jobs, bounds
    WHERE jobs.finished_at >= bounds.first_minute
      AND jobs.state = 'succeeded'
    GROUP BY 1
), failed AS (
    SELECT date_trunc('minute', e.at) AS minute, count(*) AS n
    FROM jobrun.job_events AS e, bounds
    WHERE e.at >= bounds.first_minute
      AND (e.kind IN ('retrying', 'dead')
           OR (e.kind = 'reaped' AND e.detail ->> 'verdict' = 'queued'))
    GROUP BY 1
)
SELECT minutes.minute::timestamptz AS minute,
       COALESCE(done.n, 0)::int8 AS succeeded,
       COALESCE(failed.n, 0)::int8 AS failed
FROM minutes
LEFT JOIN done ON done.minute = minutes.minute
LEFT JOIN failed ON failed.minute = minutes.minute
ORDER BY minutes.minute;

-- name: WebLeaseOwners :many
-- Every lease owner holding leases now, with how many, how many of those
-- wait for a thread (claimed ahead, not started: started_at is NULL), the
-- most recent heartbeat or claim (updated_at) and its latest lease expiry;
-- through jobs_leased_queue_idx. Expired leases the reaper has not taken back
-- yet count too: their owner may be gone, which the page tells by the expiry.
SELECT jobs.lease_owner::text AS owner,
       count(*)::int8 AS leased,
       count(*) FILTER (WHERE jobs.started_at IS NULL)::int8 AS waiting,
       max(jobs.updated_at)::timestamptz AS last_seen_at,
       max(jobs.lease_expires_at)::timestamptz AS lease_expires_at
FROM jobrun.jobs AS jobs
WHERE jobs.state = 'leased'
GROUP BY jobs.lease_owner
ORDER BY jobs.lease_owner;

-- name: WebWaitingByQueue :many
-- Per queue, the leased jobs that wait for a thread: claimed ahead by a
-- worker, not started (started_at is NULL; their attempt not counted yet).
-- Through jobs_leased_queue_idx, like the leased counts: a few per thread.
SELECT jobs.queue::text AS queue,
       count(*)::int8 AS waiting
FROM jobrun.jobs AS jobs
WHERE jobs.state = 'leased' AND jobs.started_at IS NULL
GROUP BY jobs.queue
ORDER BY jobs.queue;

-- name: WebRunningJobs :many
-- The leased jobs themselves, by owner (the overview lists them under their
-- worker), at most max_rows.
SELECT * FROM jobrun.jobs AS jobs
WHERE jobs.state = 'leased'
ORDER BY jobs.lease_owner, jobs.started_at IS NULL, jobs.id
LIMIT sqlc.arg(max_rows);

-- name: WebSchedules :many
-- Every schedule with its last fire (schedules.last_fired_at, set by the
-- leader's materialisation); the ids are the operator's: a bounded set.
SELECT s.id, s.cron, s.timezone, s.queue, s.type, s.priority, s.max_attempts,
       s.next_run_at, s.last_fired_at, s.paused
FROM jobrun.schedules AS s
ORDER BY s.id;

-- name: WebEffect :one
-- The ledger row of an effect key, if its commit callable committed: which
-- job wrote it, and when.
SELECT pe.job_id, pe.created_at
FROM jobrun.processed_effects AS pe
WHERE pe.scope = sqlc.arg(scope) AND pe.key = sqlc.arg(key);

-- name: WebJobIdNeighbours :many
-- Each given id's nearest neighbours along the primary key (two index probes
-- each, whatever the table's size): how much of an id tells it apart from
-- every other job, its shortest unique prefix, as git abbreviates commits.
SELECT given.id::uuid AS id,
       (SELECT jobs.id FROM jobrun.jobs AS jobs WHERE jobs.id < given.id
        ORDER BY jobs.id DESC LIMIT 1)::uuid AS below,
       (SELECT jobs.id FROM jobrun.jobs AS jobs WHERE jobs.id > given.id
        ORDER BY jobs.id LIMIT 1)::uuid AS above
FROM unnest(sqlc.arg(ids)::uuid[]) AS given(id);

-- Workflows (issue 29, item 7). A workflow has no state column: its state is
-- derived from its jobs' by jobrun.job.workflow.WorkflowState.of, in Python,
-- from the counts below (one rule for the CLI, the dashboard and the
-- metrics). A workflow's jobs are found through jobrun.workflow_jobs (its
-- primary key, migration 0024): a row costs an index scan of its own
-- jobs (tests/web/test_workflow_queries.py EXPLAINs these). One workflow's
-- page reads it as the store's workflow() does (GetWorkflow, WorkflowNodes,
-- WorkflowEdges of workflows.sql), at most as many rows as it draws.

-- name: WebWorkflowsPage :many
-- Workflows newest first (created_at, then id), older than the workflow
-- before when given (keyset: no OFFSET), at most max_rows, each with its
-- jobs by state and its last finish (its created_at while none has
-- finished: a completion only once no job can run). Along
-- workflows_created_idx (created_at, id; migration 0018) backwards from the
-- page bound, as the jobs pages along the primary key; jobs are read
-- through workflow_jobs, only for the rows of the page.
WITH page AS (
    SELECT w.id, w.name, w.created_at
    FROM jobrun.workflows AS w
    WHERE sqlc.narg(before)::uuid IS NULL
       OR (w.created_at, w.id) < (SELECT b.created_at, b.id FROM jobrun.workflows AS b
                                  WHERE b.id = sqlc.narg(before)::uuid)
    ORDER BY w.created_at DESC, w.id DESC
    LIMIT sqlc.arg(max_rows)
)
SELECT page.id, page.name, page.created_at,
       c.waiting, c.queued, c.leased, c.succeeded, c.dead, c.cancelled, c.finished_at
FROM page
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE jobs.state = 'waiting')::int8 AS waiting,
           count(*) FILTER (WHERE jobs.state = 'queued')::int8 AS queued,
           count(*) FILTER (WHERE jobs.state = 'leased')::int8 AS leased,
           count(*) FILTER (WHERE jobs.state = 'succeeded')::int8 AS succeeded,
           count(*) FILTER (WHERE jobs.state = 'dead')::int8 AS dead,
           count(*) FILTER (WHERE jobs.state = 'cancelled')::int8 AS cancelled,
           COALESCE(max(jobs.finished_at), page.created_at)::timestamptz AS finished_at
    FROM jobrun.workflow_jobs AS m JOIN jobrun.jobs AS jobs ON jobs.id = m.job_id
    WHERE m.workflow_id = page.id
) AS c
ORDER BY page.created_at DESC, page.id DESC;

-- name: WebWorkflowIdsInRange :many
-- The workflows whose id lies in [id_low, id_high] (the span of an id
-- prefix), in id order, at most max_rows: a bounded scan of the primary key,
-- however short the prefix.
SELECT w.id
FROM jobrun.workflows AS w
WHERE w.id BETWEEN sqlc.arg(id_low)::uuid AND sqlc.arg(id_high)::uuid
ORDER BY w.id
LIMIT sqlc.arg(max_rows);
