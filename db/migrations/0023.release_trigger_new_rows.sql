-- depends: 0022.dependency_churn

-- The release trigger reads the statement's new rows only (issue 29, the
-- cost per node; issue 27, less work per update of jobs).
--
-- Migration 0020's trigger kept both transition tables of every UPDATE of
-- jobs (claims, completions, heartbeats: each row copied twice into a
-- tuplestore) and picked the parents a statement finished by joining the
-- new rows to the old ones to see that each was not finished before: a
-- nested loop over both tuplestores, 7.6 us per node on the bench's
-- fan-out of 10,000 (batches of ~100 finished parents, each one read
-- against every old row).
--
-- The old rows are not needed: every finished parent of the statement is
-- handed on, and an edge counts once whatever calls reach it, because
-- jobrun.parents_finished counts only the edges not done yet and marks
-- them done in the same statement. A parent that was finished already
-- (a finished row updated again) has only done edges, so it changes
-- nothing. An edge is not done while its parent is finished only inside the
-- transaction that writes it (InsertDependencies, then SettleFinishedParents
-- at once), or when a retry reopens it for a parent it queues again in the
-- same transaction (ReopenEdges, RequeueJobs), no statement in between.
--
-- Locks and time: DROP/CREATE TRIGGER take SHARE ROW EXCLUSIVE on jobs for
-- a catalog change (no scan): a moment, after the transactions using jobs.
UPDATE jobrun.schema_version SET at = at
WHERE set_config('jobrun_migrate.search_path', current_setting('search_path'), true) IS NOT NULL;
UPDATE jobrun.schema_version SET at = at
WHERE set_config('search_path',
                 (SELECT format('%I, pg_catalog', n.nspname)
                  FROM pg_catalog.pg_namespace AS n
                  WHERE n.oid = (SELECT t.typnamespace FROM pg_catalog.pg_type AS t
                                 WHERE t.oid = pg_typeof(NULL::jobrun.job_state)::oid)),
                 true) IS NOT NULL;

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
    WHERE n.has_dependents AND n.state IN ('succeeded', 'dead', 'cancelled');
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
    REFERENCING NEW TABLE AS finished_new
    FOR EACH STATEMENT
    EXECUTE FUNCTION jobrun.jobs_release_dependents_of_statement();

UPDATE jobrun.schema_version SET version = 23, at = now();
