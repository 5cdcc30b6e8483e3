-- depends: 0024.workflow_members

-- A child released by the worker's own round is leased to that worker at
-- once: a continuation lease (issue 29, the cost per chain node).
--
-- A worker's round (Store.exchange) completes the jobs its threads finished
-- and claims in one transaction. The completion releases the finished
-- parents' children (waiting -> queued, jobrun.parents_finished) and the
-- claim then takes them (queued -> leased): two row versions of each child,
-- each a change of state and so never a HOT update (jobs_claim_idx reads
-- the state), each with its index entries, and the claim's scan of
-- jobs_claim_idx stepping over the entries the release had just written.
-- Measured on PostgreSQL 15 (pg_stat_statements, 32 chains of 1,000), the
-- claim was 45 us of server time per chain node against 34 for a plain job.
--
-- The round now names its claim in jobrun_continue.to (JSON: owner, queues,
-- room, start, ttl, events; set LOCAL by the store before it completes),
-- and parents_finished writes a released child straight into a lease for
-- that owner (waiting -> leased, one row version) when the claim would have
-- taken it: its queue is one the round claims, not paused and without
-- limits (a limited queue's room is counted under its lock, by
-- ClaimLimitedJobs only), it is due, its type is one the worker knows (any,
-- for an owner with no row in workers), and no due job queued in the
-- claim's queues comes before it in the claim's order (priority, run_at,
-- id): a continuation never takes a job's turn. At most the round's room are leased,
-- best first; the first of the round's start are started (their attempt
-- counted), the others buffered, as the claim does. Each writes its
-- "released" event and then its "claimed" event, as before; the wake-up is
-- sent for the children left queued only. jobrun.claim_jobs returns the
-- continued children first (named in jobrun_continue.ids, for that owner
-- only, once) and claims the rest of its room; in such a round it keeps the
-- session's synchronous_commit (the round completes jobs: their success is
-- durable once COMMIT answers), where the round used to note the setting
-- before the claim switched it off and put it back after, two statements.
--
-- Without jobrun_continue.to (a completion alone, Store.complete, a retry,
-- any transaction of a client), the release is unchanged.
--
-- Locks and time: CREATE OR REPLACE FUNCTION locks no table: instant at any
-- size.
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
    -- The round's claim, when a worker's round is releasing (see above).
    cont jsonb := NULLIF(current_setting('jobrun_continue.to', true), '')::jsonb;
    cont_owner text;
    cont_queues text[];
    cont_types text[];
    cont_room int8 := 0;
    cont_start int8 := 0;
    continued uuid[] := '{}';
    begun int8 := 0;
    leased uuid[];
    leased_started int8;
BEGIN
    IF cont IS NOT NULL THEN
        cont_owner := cont ->> 'owner';
        cont_queues := ARRAY(SELECT jsonb_array_elements_text(cont -> 'queues'));
        cont_types := (SELECT w.types FROM workers AS w WHERE w.id = cont_owner);
        continued := COALESCE(NULLIF(current_setting('jobrun_continue.ids', true), '')::uuid[],
                              '{}');
        begun := COALESCE(NULLIF(current_setting('jobrun_continue.started', true), '')::int8, 0);
        cont_room := (cont ->> 'room')::int8 - cardinality(continued);
        cont_start := GREATEST((cont ->> 'start')::int8 - begun, 0);
    END IF;
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
        ), claimable AS (
            -- The released children the round's claim would take, best first.
            SELECT c.id, row_number() OVER (ORDER BY c.priority, c.run_at, c.id) AS nth
            FROM counted JOIN jobs AS c ON c.id = counted.child_id
            WHERE cont_room > 0
              AND c.state = 'waiting' AND c.pending_parents = counted.n
              AND NOT (counted.failed_parent IS NOT NULL AND c.on_parent_failure = 'cancel')
              AND c.queue = ANY(cont_queues) AND c.run_at <= now()
              AND COALESCE(c.type = ANY(cont_types), true)
              AND NOT EXISTS (SELECT 1 FROM queue_pauses AS qp WHERE qp.queue = c.queue)
              AND NOT EXISTS (SELECT 1 FROM queue_limits AS ql WHERE ql.queue = c.queue)
              AND NOT EXISTS (SELECT 1 FROM jobs AS o
                              WHERE o.state = 'queued' AND o.queue = ANY(cont_queues)
                                AND (o.priority, o.run_at, o.id) < (c.priority, c.run_at, c.id)
                                AND o.run_at <= now())
        ), go AS (
            SELECT claimable.id, claimable.nth FROM claimable WHERE claimable.nth <= cont_room
        ), moved AS (
            UPDATE jobs AS c
            SET pending_parents = c.pending_parents - counted.n,
                state = CASE WHEN counted.failed_parent IS NOT NULL
                                  AND c.on_parent_failure = 'cancel' THEN 'cancelled'
                             WHEN go.id IS NOT NULL THEN 'leased'
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
                -- A continuation: what jobrun.claim_jobs writes into a claim.
                attempts = c.attempts + COALESCE(go.nth <= cont_start, false)::int4,
                started_at = CASE WHEN go.id IS NULL THEN c.started_at
                                  WHEN go.nth <= cont_start THEN now() END,
                lease_owner = CASE WHEN go.id IS NOT NULL THEN cont_owner END,
                lease_token = CASE WHEN go.id IS NOT NULL THEN gen_random_uuid() END,
                lease_expires_at = CASE WHEN go.id IS NOT NULL
                                        THEN now() + make_interval(
                                                 secs => (cont ->> 'ttl')::float8) END,
                progress = CASE WHEN go.id IS NULL THEN c.progress END,
                progress_message = CASE WHEN go.id IS NULL THEN c.progress_message END,
                progress_at = CASE WHEN go.id IS NULL THEN c.progress_at END,
                updated_at = now()
            FROM counted LEFT JOIN go ON go.id = counted.child_id
            WHERE c.id = counted.child_id AND c.state = 'waiting'
            RETURNING c.id, c.queue, c.state, c.attempts, c.run_at, c.notify_finished,
                      c.has_dependents, c.started_at,
                      COALESCE(counted.failed_parent, counted.first_parent)::uuid AS parent
        ), ev AS (
            INSERT INTO job_events (job_id, kind, attempt, at, detail)
            SELECT moved.id, CASE WHEN moved.state = 'cancelled' THEN 'cancelled' ELSE 'released' END,
                   moved.attempts - (moved.state = 'leased' AND moved.started_at IS NOT NULL)::int4,
                   now(),
                   jsonb_build_object('via', 'dependency', 'parent', moved.parent,
                                      'parent_state', p.state)
            FROM moved JOIN p ON p.id = moved.parent
            WHERE moved.state <> 'waiting'
            UNION ALL
            SELECT moved.id, 'claimed', moved.attempts, statement_timestamp(),
                   CASE WHEN moved.started_at IS NULL THEN '{"started": false}'::jsonb END
            FROM moved
            WHERE moved.state = 'leased' AND COALESCE((cont ->> 'events')::boolean, false)
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
                        '{}'),
               COALESCE(array_agg(moved.id) FILTER (WHERE moved.state = 'leased'), '{}'),
               count(*) FILTER (WHERE moved.state = 'leased' AND moved.started_at IS NOT NULL)
        INTO more, leased, leased_started
        FROM moved
        WHERE (SELECT count(*) FROM finished) >= 0 AND (SELECT count(*) FROM wake) >= 0;

        IF cardinality(leased) > 0 THEN
            continued := continued || leased;
            begun := begun + leased_started;
            cont_room := cont_room - cardinality(leased);
            cont_start := GREATEST(cont_start - leased_started, 0);
            PERFORM set_config('jobrun_continue.ids', continued::text, true),
                    set_config('jobrun_continue.started', begun::text, true);
        END IF;
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
DECLARE
    continued uuid[] := NULLIF(current_setting('jobrun_continue.ids', true), '')::uuid[];
    begun int8;
BEGIN
    -- The children this transaction's release leased to owner (see above):
    -- returned once, first, and counted in the room and the starts.
    IF continued IS NOT NULL THEN
        begun := COALESCE(NULLIF(current_setting('jobrun_continue.started', true), '')::int8, 0);
        PERFORM set_config('jobrun_continue.ids', '', true),
                set_config('jobrun_continue.started', '', true);
        IF current_setting('jobrun_continue.to', true)::jsonb ->> 'owner' = claim_jobs.owner THEN
            RETURN QUERY
            SELECT jobs.* FROM jobs AS jobs
            WHERE jobs.id = ANY(continued) AND jobs.state = 'leased'
              AND jobs.lease_owner = claim_jobs.owner;
            max_jobs := max_jobs - cardinality(continued);
            start := GREATEST(start - begun, 0);
            IF max_jobs <= 0 THEN
                RETURN;
            END IF;
        END IF;
    END IF;
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
      -- Asynchronous, as a claim alone; but a round that completes jobs
      -- (it names its claim: jobrun_continue.to) keeps the session's mode,
      -- so that its completions are durable once COMMIT answers.
      AND (SELECT set_config('synchronous_commit',
                             CASE WHEN COALESCE(current_setting('jobrun_continue.to', true), '') = ''
                                  THEN 'off' ELSE current_setting('synchronous_commit') END,
                             true)) IS NOT NULL
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

UPDATE jobrun.schema_version SET version = 25, at = now();
