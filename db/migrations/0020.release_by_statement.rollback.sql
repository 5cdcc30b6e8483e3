-- Back to migration 0016's trigger: one call of parent_finished per parent row.
DROP TRIGGER jobs_release_dependents ON jobrun.jobs;
DROP FUNCTION jobrun.jobs_release_dependents_of_statement();
UPDATE jobrun.schema_version SET at = at
WHERE set_config('jobrun_migrate.search_path', current_setting('search_path'), true) IS NOT NULL;
UPDATE jobrun.schema_version SET at = at
WHERE set_config('search_path',
                 (SELECT format('%I, pg_catalog', n.nspname)
                  FROM pg_catalog.pg_namespace AS n
                  WHERE n.oid = (SELECT t.typnamespace FROM pg_catalog.pg_type AS t
                                 WHERE t.oid = pg_typeof(NULL::jobrun.job_state)::oid)),
                 true) IS NOT NULL;

-- A parent finished (finished_state is terminal): count it with each child
-- still waiting for it, once per edge; queue the children it was the last
-- parent of, cancel those its failure cancels (policy 'cancel'), with their
-- events and wake-ups. Called by the trigger, and by an enqueue for parents
-- already finished when their children were written.
--
-- A cancelled child with children of its own is a parent that finished: the
-- cascade goes on here, in a loop over the jobs it reaches, breadth first,
-- not by the trigger firing inside the trigger (each nesting takes stack: a
-- chain of 400 cancelled that way exceeded max_stack_depth). While the loop
-- runs, the setting jobrun_deps.cascade tells the trigger to leave the
-- children's own transitions to it.
CREATE OR REPLACE FUNCTION jobrun.parent_finished(finished_id uuid, finished_state jobrun.job_state)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    wake_channel text := COALESCE(NULLIF(current_setting('jobrun_notify.channel', true), ''),
                                  'jobrun_jobs');
    outer_flag text := current_setting('jobrun_deps.cascade', true);
    frontier uuid[] := ARRAY[finished_id];
    frontier_states job_state[] := ARRAY[finished_state];
    i int := 1;
    parent uuid;
    parent_state job_state;
    failed boolean;
    node text;
    more uuid[];
BEGIN
    PERFORM set_config('jobrun_deps.cascade', 'on', true);
    WHILE i <= cardinality(frontier) LOOP
        parent := frontier[i];
        parent_state := frontier_states[i];
        failed := parent_state <> 'succeeded';
        -- The children, locked in id order before any is changed.
        PERFORM 1 FROM jobs AS c JOIN job_dependencies AS d ON d.child_id = c.id
        WHERE d.parent_id = parent AND NOT d.done AND c.state = 'waiting'
        ORDER BY c.id
        FOR NO KEY UPDATE OF c;
        SELECT p.workflow_node INTO node FROM jobs AS p WHERE p.id = parent;

        WITH moved AS (
            UPDATE jobs AS c
            SET pending_parents = c.pending_parents - 1,
                state = CASE WHEN failed AND c.on_parent_failure = 'cancel' THEN 'cancelled'
                             WHEN c.pending_parents = 1 THEN 'queued'
                             ELSE 'waiting' END::job_state,
                finished_at = CASE WHEN failed AND c.on_parent_failure = 'cancel' THEN now() END,
                last_error = CASE WHEN failed AND c.on_parent_failure = 'cancel'
                                  THEN format('parent %s%s ended %s', parent,
                                              COALESCE(' (' || node || ')', ''), parent_state)
                                  ELSE c.last_error END,
                updated_at = now()
            FROM job_dependencies AS d
            WHERE d.parent_id = parent AND d.child_id = c.id AND NOT d.done
              AND c.state = 'waiting'
            RETURNING c.id, c.queue, c.state, c.attempts, c.run_at, c.notify_finished,
                      c.has_dependents
        ), ev AS (
            INSERT INTO job_events (job_id, kind, attempt, detail)
            SELECT moved.id, CASE WHEN moved.state = 'queued' THEN 'released' ELSE 'cancelled' END,
                   moved.attempts,
                   jsonb_build_object('via', 'dependency', 'parent', parent,
                                      'parent_state', parent_state)
            FROM moved WHERE moved.state <> 'waiting'
        ), edges AS (
            UPDATE job_dependencies AS d SET done = true
            WHERE d.parent_id = parent AND NOT d.done
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

        frontier := frontier || more;
        frontier_states := frontier_states
                           || array_fill('cancelled'::job_state, ARRAY[cardinality(more)]);
        i := i + 1;
    END LOOP;
    PERFORM set_config('jobrun_deps.cascade', COALESCE(outer_flag, ''), true);
END
$$;

CREATE FUNCTION jobrun.jobs_release_dependents() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- Inside parent_finished's loop: the loop counts this job itself.
    IF current_setting('jobrun_deps.cascade', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM parent_finished(NEW.id, NEW.state);
    RETURN NULL;
END
$$;

UPDATE jobrun.schema_version SET at = at
WHERE set_config('search_path', current_setting('jobrun_migrate.search_path'), true) IS NOT NULL;

DROP FUNCTION jobrun.parents_finished(uuid[], jobrun.job_state[]);
CREATE TRIGGER jobs_release_dependents
    AFTER UPDATE OF state ON jobrun.jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND NEW.state IN ('succeeded', 'dead', 'cancelled')
          AND OLD.state NOT IN ('succeeded', 'dead', 'cancelled'))
    EXECUTE FUNCTION jobrun.jobs_release_dependents();
UPDATE jobrun.schema_version SET version = 19, at = now();
