-- Back to migration 0020's trigger: both transition tables, the parents that
-- were not finished before the statement.
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
