-- Back to migration 0020's trigger (both transition tables, the parents that
-- were not finished before the statement) and its parents_finished.
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
BEGIN
    PERFORM set_config('jobrun_deps.cascade', 'on', true);
    WHILE cardinality(frontier) > 0 LOOP
        -- The children, locked in id order before any is changed.
        PERFORM 1 FROM jobs AS c
        WHERE c.id IN (SELECT d.child_id FROM job_dependencies AS d
                       WHERE d.parent_id = ANY(frontier) AND NOT d.done)
          AND c.state = 'waiting'
        ORDER BY c.id
        FOR NO KEY UPDATE OF c;

        WITH p AS (
            SELECT * FROM unnest(frontier, frontier_states) AS p(id, state)
        ), counted AS (
            SELECT d.child_id, count(*)::int AS n,
                   min(d.parent_id::text) AS first_parent,
                   min(d.parent_id::text) FILTER (WHERE p.state <> 'succeeded') AS failed_parent
            FROM job_dependencies AS d JOIN p ON p.id = d.parent_id
            WHERE NOT d.done
            GROUP BY d.child_id
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
        ), edges AS (
            UPDATE job_dependencies AS d SET done = true
            WHERE d.parent_id = ANY(frontier) AND NOT d.done
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

CREATE OR REPLACE FUNCTION jobrun.jobs_release_dependents_of_statement() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    ids uuid[];
    states job_state[];
BEGIN
    -- Inside parents_finished's loop: the loop counts these jobs itself.
    IF current_setting('jobrun_deps.cascade', true) = 'on' THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(n.id ORDER BY n.id), array_agg(n.state ORDER BY n.id)
    INTO ids, states
    FROM finished_new AS n
    WHERE n.has_dependents AND n.state IN ('succeeded', 'dead', 'cancelled')
      AND EXISTS (SELECT 1 FROM finished_old AS o
                  WHERE o.id = n.id AND o.state NOT IN ('succeeded', 'dead', 'cancelled'));
    IF ids IS NOT NULL THEN
        PERFORM parents_finished(ids, states);
    END IF;
    RETURN NULL;
END
$$;

UPDATE jobrun.schema_version SET at = at
WHERE set_config('search_path', current_setting('jobrun_migrate.search_path'), true) IS NOT NULL;

DROP TRIGGER jobs_release_dependents ON jobrun.jobs;
CREATE TRIGGER jobs_release_dependents
    AFTER UPDATE ON jobrun.jobs
    REFERENCING OLD TABLE AS finished_old NEW TABLE AS finished_new
    FOR EACH STATEMENT
    EXECUTE FUNCTION jobrun.jobs_release_dependents_of_statement();

UPDATE jobrun.schema_version SET version = 22, at = now();
