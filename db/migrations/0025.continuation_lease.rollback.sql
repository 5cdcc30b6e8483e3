-- Migration 0025 rolled back: the release and the claim as migrations 0023 and
-- 0021 left them (no continuation lease).
UPDATE jobrun.schema_version SET at = at
WHERE set_config('jobrun_migrate.search_path', current_setting('search_path'), true) IS NOT NULL;
UPDATE jobrun.schema_version SET at = at
WHERE set_config('search_path',
                 (SELECT format('%I, pg_catalog', n.nspname)
                  FROM pg_catalog.pg_namespace AS n
                  WHERE n.oid = (SELECT t.typnamespace FROM pg_catalog.pg_type AS t
                                 WHERE t.oid = pg_typeof(NULL::jobrun.job_state)::oid)),
                 true) IS NOT NULL;

CREATE OR REPLACE FUNCTION jobrun.parents_finished(finished_ids uuid[], finished_states jobrun.job_state[])
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    wake_channel text := COALESCE(NULLIF(current_setting('jobrun_notify.channel', true), ''),
                                  'jobrun_jobs');
    outer_flag text := current_setting('jobrun_deps.cascade', true);
    frontier uuid[] := finished_ids;
    frontier_states job_state[] := finished_states;
    more uuid[];
    edge_children uuid[];
    edge_parents uuid[];
BEGIN
    PERFORM set_config('jobrun_deps.cascade', 'on', true);
    WHILE cardinality(frontier) > 0 LOOP
        -- The finished parents' edges marked done, once: what this returns is
        -- what is counted, read from the edges' parent index only here.
        WITH e AS (
            UPDATE job_dependencies AS d SET done = true
            WHERE d.parent_id = ANY(frontier) AND NOT d.done
            RETURNING d.child_id, d.parent_id
        )
        SELECT COALESCE(array_agg(e.child_id), '{}'), COALESCE(array_agg(e.parent_id), '{}')
        INTO edge_children, edge_parents
        FROM e;

        -- The children, locked in id order before any is changed.
        PERFORM 1 FROM jobs AS c
        WHERE c.id = ANY(edge_children) AND c.state = 'waiting'
        ORDER BY c.id
        FOR NO KEY UPDATE OF c;

        WITH p AS (
            SELECT * FROM unnest(frontier, frontier_states) AS p(id, state)
        ), counted AS (
            SELECT e.child_id, count(*)::int AS n,
                   min(e.parent_id::text) AS first_parent,
                   min(e.parent_id::text) FILTER (WHERE p.state <> 'succeeded') AS failed_parent
            FROM unnest(edge_children, edge_parents) AS e(child_id, parent_id)
            JOIN p ON p.id = e.parent_id
            GROUP BY e.child_id
        ), moved AS (
            UPDATE jobs AS c
            SET pending_parents = c.pending_parents - counted.n,
                state = CASE WHEN counted.failed_parent IS NOT NULL
                                  AND c.on_parent_failure = 'cancel' THEN 'cancelled'
                             WHEN c.pending_parents = counted.n THEN 'queued'
                             ELSE 'waiting' END::job_state,
                finished_at = CASE WHEN counted.failed_parent IS NOT NULL
                                        AND c.on_parent_failure = 'cancel' THEN now() END,
                last_error = CASE WHEN counted.failed_parent IS NOT NULL
                                       AND c.on_parent_failure = 'cancel'
                                  THEN (SELECT format('parent %s%s ended %s', f.id,
                                                      COALESCE(' (' || f.workflow_node || ')', ''),
                                                      f.state)
                                        FROM jobs AS f WHERE f.id = counted.failed_parent::uuid)
                                  ELSE c.last_error END,
                updated_at = now()
            FROM counted
            WHERE c.id = counted.child_id AND c.state = 'waiting'
            RETURNING c.id, c.queue, c.state, c.attempts, c.run_at, c.notify_finished,
                      c.has_dependents,
                      COALESCE(counted.failed_parent, counted.first_parent)::uuid AS parent
        ), ev AS (
            INSERT INTO job_events (job_id, kind, attempt, detail)
            SELECT moved.id, CASE WHEN moved.state = 'queued' THEN 'released' ELSE 'cancelled' END,
                   moved.attempts,
                   jsonb_build_object('via', 'dependency', 'parent', moved.parent,
                                      'parent_state', p.state)
            FROM moved JOIN p ON p.id = moved.parent
            WHERE moved.state <> 'waiting'
        ), finished AS (
            SELECT pg_notify(wake_channel || '_done', moved.id::text) FROM moved
            WHERE moved.state = 'cancelled' AND moved.notify_finished
        ), wake AS (
            SELECT pg_notify(wake_channel,
                             CASE WHEN r.delay_ms > 0 THEN r.queue || '@' || r.delay_ms
                                  ELSE r.queue END)
            FROM (SELECT moved.queue,
                         max(ceil(1000 * extract(epoch FROM moved.run_at - clock_timestamp())))::int8
                             AS delay_ms
                  FROM moved WHERE moved.state = 'queued' GROUP BY moved.queue) AS r
            WHERE pg_notification_queue_usage() < 0.5
        )
        SELECT COALESCE(array_agg(moved.id ORDER BY moved.id)
                            FILTER (WHERE moved.state = 'cancelled' AND moved.has_dependents),
                        '{}')
        INTO more
        FROM moved
        WHERE (SELECT count(*) FROM finished) >= 0 AND (SELECT count(*) FROM wake) >= 0;

        frontier := more;
        frontier_states := array_fill('cancelled'::job_state, ARRAY[cardinality(more)]);
    END LOOP;
    PERFORM set_config('jobrun_deps.cascade', COALESCE(outer_flag, ''), true);
END
$$;

CREATE OR REPLACE FUNCTION jobrun.claim_jobs(queues text[], owner text, max_jobs int8, start int8,
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

UPDATE jobrun.schema_version SET version = 24, at = now();
