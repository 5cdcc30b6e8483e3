-- depends: 0015.steps

-- Dependencies between jobs and workflows as a unit (issue 29, items 1-3).
--
-- A job may wait for other jobs (its parents, of any queue) to finish. A
-- waiting job is in the new state 'waiting': it is in no index of the claim
-- (jobs_claim_idx holds state = 'queued' only), so a million waiting jobs
-- cost nothing to the claim of runnable ones. It carries
--
--   pending_parents   its parents not finished yet (0 for every other job);
--   on_parent_failure what a parent's failure (dead, cancelled) does to it:
--                     'cancel' (it ends cancelled, last_error naming the
--                     parent) or 'run' (it counts the parent as finished and
--                     sees the failure in its parents' results); NULL for a
--                     job without parents, which is how the claim knows, in
--                     one column it already reads, that there is nothing to
--                     load for it;
--   has_dependents    true when some job waits or waited for it: the cheap
--                     test of the trigger below, so that a job nobody waits
--                     for pays one boolean test per state change and no more;
--   workflow_id, workflow_node
--                     the workflow it belongs to and its node's name there.
--
-- Release is exact and needs no poller: when a parent reaches a terminal
-- state (succeeded, dead, cancelled) by any path (a complete, a final
-- failure, a cancel, the reaper, a release that ends cancelled, a cascade),
-- the trigger jobs_release_dependents calls jobrun.parent_finished in the
-- same transaction. Each child's counter is decremented with an UPDATE of
-- its row: the row lock serialises two parents finishing at the same
-- instant on two workers, and the second UPDATE re-reads the first's
-- committed counter, so exactly one of them sees it reach 0 and queues the
-- child (a read of "are all parents finished?" under two snapshots would
-- strand it). Children are locked in id order (no deadlock between two
-- parents sharing children). Each edge is counted once (its done flag): a
-- parent retried by an operator and finishing again releases nothing twice.
-- A child cancelled by a failed parent may have dependents of its own: the
-- same function goes on to them, in a loop (a chain of any length).
--
-- The wake-up of a released child's queue goes to the channel named by the
-- setting jobrun_notify.channel, else jobrun_jobs (JOBRUN_NOTIFY_CHANNEL's
-- default); a deployment on another channel sets it for its roles
-- (ALTER ROLE ... SET jobrun_notify.channel = '...'), or its workers find
-- the child by polling.
--
-- Why an enum value (ALTER TYPE ... ADD VALUE): a waiting job must be out of
-- jobs_claim_idx, whose predicate is state = 'queued'; changing the index
-- would rebuild it. The value is added in this migration's transaction
-- (PostgreSQL 12+ allows it) and is not used by anything this migration
-- executes: the functions name it in PL/pgSQL bodies, parsed when first
-- called. A later migration of the same script (jobrun.migrate's
-- migration_sql runs them in one transaction) must not execute it either.
--
-- The functions name tables without a schema and run with the search_path
-- of their creation (SET search_path FROM CURRENT, set below to the schema
-- holding jobrun's job_state type), so a deployment in another schema
-- (JOBRUN_SCHEMA) gets functions reading its own tables.
--
-- Locks and time. No rewrite of jobs and no scan of it: the added columns
-- are nullable or have constant defaults (a catalog change), the checks
-- are NOT VALID (the rows before them hold the defaults), no index on jobs
-- is built. ALTER TABLE takes ACCESS EXCLUSIVE on jobs until the migration
-- commits: it waits for the transactions using jobs (a Complete running a
-- long commit callable included) and, while it waits, every statement on
-- jobs queues behind it; so it comes last, after the new tables and
-- functions, followed only by CREATE TRIGGER and the version's update.
-- Measured on 1,000,000 jobs (276 MB: 100,000 queued) on a busy 2-core
-- machine: the whole migration, connection included, took 0.09 to 0.13 s;
-- nothing in it grows with the table.
ALTER TYPE jobrun.job_state ADD VALUE IF NOT EXISTS 'waiting' BEFORE 'queued';

CREATE TABLE jobrun.workflows (
    id         uuid        PRIMARY KEY,
    name       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workflows_name_length CHECK (length(name) BETWEEN 1 AND 255)
);

-- The edges. child_id first: the claim reads a child's parents through the
-- primary key; parent_id's index is the trigger's way to a parent's
-- children. No foreign keys: an FK to jobs would add a check to every purge
-- and a KEY SHARE lock per insert (see job_events); purge deletes a child's
-- edges with it.
CREATE TABLE jobrun.job_dependencies (
    child_id  uuid    NOT NULL,
    parent_id uuid    NOT NULL,
    done      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (child_id, parent_id),
    CONSTRAINT job_dependencies_no_self_edge CHECK (child_id <> parent_id)
);
CREATE INDEX job_dependencies_parent_idx ON jobrun.job_dependencies (parent_id);

-- The search_path the functions below are created with (and keep): the
-- schema of job_state, whatever its name. UPDATEs of the one schema_version
-- row rather than SELECTs, which the migration runner would print.
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
CREATE FUNCTION jobrun.parent_finished(finished_id uuid, finished_state jobrun.job_state)
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

-- Last, so that the lock on jobs is held the shortest: the columns (a
-- catalog change under ACCESS EXCLUSIVE until the commit), then the trigger.
ALTER TABLE jobrun.jobs
    ADD COLUMN pending_parents   integer NOT NULL DEFAULT 0,
    ADD COLUMN has_dependents    boolean NOT NULL DEFAULT false,
    ADD COLUMN on_parent_failure text,
    ADD COLUMN workflow_id       uuid,
    ADD COLUMN workflow_node     text;
-- NOT VALID: a new constraint would otherwise scan every row under the
-- ALTER's lock; the rows before it all hold the defaults, which pass.
ALTER TABLE jobrun.jobs ADD CONSTRAINT jobs_pending_parents_range
    CHECK (pending_parents >= 0) NOT VALID;
ALTER TABLE jobrun.jobs ADD CONSTRAINT jobs_on_parent_failure_known
    CHECK (on_parent_failure IN ('cancel', 'run')) NOT VALID;

-- Fires only for a job some job waits for, on its way into a terminal state.
CREATE TRIGGER jobs_release_dependents
    AFTER UPDATE OF state ON jobrun.jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND NEW.state IN ('succeeded', 'dead', 'cancelled')
          AND OLD.state NOT IN ('succeeded', 'dead', 'cancelled'))
    EXECUTE FUNCTION jobrun.jobs_release_dependents();

UPDATE jobrun.schema_version SET version = 16, at = now();
