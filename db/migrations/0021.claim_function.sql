-- depends: 0020.release_by_statement

-- The claim as a function, so that its plan is made once per session
-- (issue 27, "less CPU per job").
--
-- ClaimJobs was planned afresh on every call (a custom plan: PostgreSQL
-- keeps a generic one only when it costs no more, and a generic plan cannot
-- see max_jobs, so on a backlog it never does). Planning cost about as much
-- as executing: measured on PostgreSQL 15 with pg_stat_statements, a worker
-- of 10 threads draining a backlog spent 82 us of server CPU per job
-- planning the claim and 85 executing it (266 in all per job); at 32
-- threads 30 and 59.
--
-- This function runs the same statement with a generic plan, cached by
-- PL/pgSQL for the session: plan_cache_mode = force_generic_plan for its
-- body only. Three settings keep that plan what the custom plan was:
--   - the claimed ids join the table through unnest(array_agg(...)) WITH
--     ORDINALITY, which a generic plan estimates at a few rows and joins on
--     the primary key; the former "FROM next WHERE jobs.id = next.id" was
--     joined to a sequential scan of jobs (the generic estimate of LIMIT
--     $n is a tenth of the queue), and "= ANY(ARRAY(SELECT ...))" repeated
--     its index scan per claimed row (208 ms for a claim of 512);
--   - jit = off: the generic plan's estimated cost can pass jit_above_cost,
--     and PostgreSQL with LLVM then compiles the claim on every call;
--   - enable_seqscan and enable_bitmapscan off: a tenth of a large queue,
--     as the generic plan guesses, could make a sequential scan and a sort
--     look cheaper than reading jobs_claim_idx in order; off, the claim
--     reads its index whatever the statistics say.
-- What it claims, and the events it writes, are ClaimJobs' own: the
-- statement is unchanged but for the join; ClaimJobs calls it and adds the
-- parents' results.
--
-- Locks and time: CREATE FUNCTION locks no table: instant at any size.
UPDATE jobrun.schema_version SET at = at
WHERE set_config('jobrun_migrate.search_path', current_setting('search_path'), true) IS NOT NULL;
UPDATE jobrun.schema_version SET at = at
WHERE set_config('search_path',
                 (SELECT format('%I, pg_catalog', n.nspname)
                  FROM pg_catalog.pg_namespace AS n
                  WHERE n.oid = (SELECT t.typnamespace FROM pg_catalog.pg_type AS t
                                 WHERE t.oid = pg_typeof(NULL::jobrun.job_state)::oid)),
                 true) IS NOT NULL;

CREATE FUNCTION jobrun.claim_jobs(queues text[], owner text, max_jobs int8, start int8,
                                 ttl_seconds float8, write_events boolean)
RETURNS SETOF jobrun.jobs LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
RETURN QUERY
WITH next AS (
    SELECT c.id, row_number() OVER (ORDER BY c.priority, c.run_at, c.id) AS nth
    FROM unnest(claim_jobs.queues::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT jobs.id, jobs.priority, jobs.run_at FROM jobs AS jobs
        WHERE jobs.state = 'queued' AND jobs.queue = q.name AND jobs.run_at <= now()
          AND (COALESCE(jobs.type = ANY((SELECT w.types FROM workers AS w
                                         WHERE w.id = claim_jobs.owner::text)::text[]), true)
               OR NOT EXISTS (SELECT 1 FROM workers AS w
                              WHERE jobs.type = ANY(w.types) AND jobs.queue = ANY(w.queues)
                                AND w.last_seen_at
                                    > now() - make_interval(secs => w.lease_ttl_seconds)))
        ORDER BY jobs.priority, jobs.run_at, jobs.id
        LIMIT claim_jobs.max_jobs
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = q.name)
      AND NOT EXISTS (SELECT 1 FROM queue_limits l WHERE l.queue = q.name)
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    ORDER BY c.priority, c.run_at, c.id
    LIMIT claim_jobs.max_jobs
), picked AS (
    SELECT array_agg(next.id ORDER BY next.nth) AS ids FROM next
), claimed AS (
    UPDATE jobs AS jobs
    SET state = 'leased',
        attempts = jobs.attempts + (next.nth <= claim_jobs.start::int8)::int4,
        started_at = CASE WHEN next.nth <= claim_jobs.start::int8 THEN now() END,
        lease_owner = claim_jobs.owner::text,
        lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(secs => claim_jobs.ttl_seconds::float8),
        progress = NULL, progress_message = NULL, progress_at = NULL,
        updated_at = now()
    FROM picked CROSS JOIN LATERAL unnest(picked.ids) WITH ORDINALITY AS next(id, nth)
    WHERE jobs.id = next.id
    RETURNING jobs.*
), ev AS (
    INSERT INTO job_events (job_id, kind, attempt, at, detail)
    SELECT claimed.id, 'claimed', claimed.attempts, statement_timestamp(),
           CASE WHEN claimed.started_at IS NULL THEN '{"started": false}'::jsonb END
    FROM claimed
    WHERE claim_jobs.write_events::boolean
)
SELECT claimed.* FROM claimed ORDER BY claimed.priority, claimed.run_at, claimed.id;
END
$$;

UPDATE jobrun.schema_version SET at = at
WHERE set_config('search_path', current_setting('jobrun_migrate.search_path'), true) IS NOT NULL;

UPDATE jobrun.schema_version SET version = 21, at = now();
