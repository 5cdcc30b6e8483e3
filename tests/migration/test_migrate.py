from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import ValidationError
from jobrun.job.model import DEFAULT_BACKOFF
from jobrun.postgres import migrate as m
from jobrun.postgres.schema import SCHEMA_VERSION

MIGRATIONS = Path(__file__).resolve().parents[2] / "db" / "migrations"


def _tables(dsn: str, schema: str = "jobrun") -> set[str]:
    with psycopg.connect(dsn) as c:
        return {
            r[0]
            for r in c.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", [schema]
            ).fetchall()
        }


def test_migrate_applies_every_migration_to_an_empty_database(empty_dsn: str) -> None:
    applied = m.migrate(empty_dsn)
    forward = sorted(
        p.name.removesuffix(".sql")
        for p in MIGRATIONS.glob("*.sql")
        if not p.name.endswith(".rollback.sql")
    )
    assert applied == forward
    assert {"jobs", "job_events", "processed_effects", "schedules"} <= _tables(empty_dsn)
    assert m.pending(empty_dsn) == []


def test_migrate_twice_applies_nothing_the_second_time(empty_dsn: str) -> None:
    m.migrate(empty_dsn)
    assert m.migrate(empty_dsn) == []


def test_five_concurrent_migrators_apply_each_migration_once(empty_dsn: str) -> None:
    results: list[list[str]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(5)

    def run() -> None:
        try:
            barrier.wait()
            results.append(m.migrate(empty_dsn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    applied = [ids for ids in results if ids]
    assert len(applied) == 1
    assert sum(len(ids) for ids in results) == len(applied[0])
    with psycopg.connect(empty_dsn) as c:
        (count,) = c.execute("SELECT count(*) FROM jobrun._yoyo_migration").fetchone()  # type: ignore[misc]
    assert count == len(applied[0])


def test_migrate_leaves_no_yoyo_lock_table(empty_dsn: str) -> None:
    m.migrate(empty_dsn)
    assert "yoyo_lock" not in _tables(empty_dsn)


def test_rollback_then_replay_gives_the_same_schema(empty_dsn: str) -> None:
    m.migrate(empty_dsn)
    before = _schema_fingerprint(empty_dsn)
    m.rollback_all(empty_dsn)
    assert not ({"jobs", "job_events", "processed_effects", "schedules"} & _tables(empty_dsn))
    m.migrate(empty_dsn)
    assert _schema_fingerprint(empty_dsn) == before


def _schema_fingerprint(dsn: str, schema: str = "jobrun") -> list[tuple[object, ...]]:
    """Columns, indexes and constraints of the schema's own tables (yoyo's left out)."""
    with psycopg.connect(dsn) as c:
        cols = c.execute(
            "SELECT table_name, column_name, data_type, udt_name, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name NOT LIKE '\\_yoyo%%' ORDER BY 1, 2",
            [schema],
        ).fetchall()
        idx = c.execute(
            "SELECT indexname, replace(indexdef, %s, 'S.') FROM pg_indexes WHERE schemaname = %s "
            "AND tablename NOT LIKE '\\_yoyo%%' ORDER BY 1",
            [f"{schema}.", schema],
        ).fetchall()
        checks = c.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE connamespace = %s::regnamespace"
            " AND conrelid::regclass::text NOT LIKE '%%yoyo%%' ORDER BY 2",
            [schema],
        ).fetchall()
    return [*cols, *idx, *[(t.removeprefix(f"{schema}."), n, d) for t, n, d in checks]]


def test_a_migrator_killed_while_holding_the_lock_blocks_nobody(empty_dsn: str) -> None:
    script = (
        "import sys, time\n"
        "from jobrun.postgres.migrate import _Backend\n"
        "b = _Backend(sys.argv[1])\n"
        "with b.lock():\n"
        "    print('locked', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, empty_dsn], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "locked"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert m.migrate(empty_dsn)  # the session lock died with the process
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


# -- a schema of its own -----------------------------------------------------------

LEGACY = Path(__file__).resolve().parent / "legacy_0_1"
JOBRUN_TABLES = {
    "jobs",
    "job_events",
    "processed_effects",
    "schedules",
    "queue_pauses",
    "workers",
    "job_steps",
    "job_fences",
}


def _public_objects(dsn: str) -> set[str]:
    """Everything in public: tables, sequences, types."""
    with psycopg.connect(dsn) as c:
        rows = c.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace"
            " UNION ALL SELECT typname FROM pg_type WHERE typnamespace = 'public'::regnamespace"
            " AND typtype = 'e'"
        ).fetchall()
    return {r[0] for r in rows}


def test_every_jobrun_object_and_its_bookkeeping_live_in_the_jobrun_schema(
    empty_dsn: str,
) -> None:
    m.migrate(empty_dsn)
    assert JOBRUN_TABLES | {"_yoyo_migration", "schema_version"} <= _tables(empty_dsn)
    assert _public_objects(empty_dsn) == set()


def test_an_applications_own_jobs_table_in_public_is_left_alone(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn) as c:
        c.execute("CREATE TABLE public.jobs (id serial PRIMARY KEY, title text)")
        c.execute("INSERT INTO public.jobs (title) VALUES ('plumber')")
    m.migrate(empty_dsn)
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT title FROM public.jobs").fetchall() == [("plumber",)]
    assert "jobs" in _tables(empty_dsn)


def _migrate_like_jobrun_0_1(dsn: str) -> None:
    """What jobrun 0.1 did: yoyo, its bookkeeping and jobrun's tables in public."""
    from yoyo import get_backend, read_migrations  # noqa: PLC0415

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    uri = (
        f"postgresql+psycopg://{params['user']}:{params.get('password', '')}@"
        f"{params['host']}:{params['port']}/{params['dbname']}"
    )
    backend = get_backend(uri)
    with backend.lock():
        backend.apply_migrations(backend.to_apply(read_migrations(str(LEGACY))))
    backend.connection.close()


def test_a_database_migrated_by_jobrun_0_1_moves_into_the_schema_with_nothing_lost(
    empty_dsn: str,
) -> None:
    _migrate_like_jobrun_0_1(empty_dsn)
    with psycopg.connect(empty_dsn) as c:
        # An application's own yoyo migration shares the bookkeeping table.
        c.execute(
            "INSERT INTO public._yoyo_migration (migration_hash, migration_id, applied_at_utc)"
            " VALUES ('apphash', '0001.app_tables', now())"
        )
        c.execute(
            "INSERT INTO public.jobs (id, queue, type, payload, backoff, state, attempts)"
            " VALUES (gen_random_uuid(), 'default', 'old.job', '{\"n\": 1}', '{}', 'queued', 0)"
        )
        c.execute(
            "INSERT INTO public.job_events (job_id, kind) SELECT id, 'enqueued' FROM public.jobs"
        )
        c.execute(
            "INSERT INTO public.processed_effects (scope, key, job_id)"
            " SELECT 'job:old.job', id::text, id FROM public.jobs"
        )
        c.execute("INSERT INTO public.queue_pauses (queue) VALUES ('emails')")
        before = c.execute("SELECT id, payload FROM public.jobs").fetchall()
    applied = m.migrate(empty_dsn)
    assert applied == [
        "0003.finished_token",
        "0004.schema_version",
        "0005.results",
        "0006.observability",
        "0007.flow_control",
        "0008.leader",
        "0009.events_brin",
        "0010.attempt_start",
        "0011.release_count",
        "0012.queue_churn",
        "0013.workers",
        "0014.events_without_pkey",
        "0015.steps",
        "0016.workflows",
        "0017.signals",
        "0018.workflow_index",
        "0019.workflow_signals",
        "0020.release_by_statement",
        "0021.claim_function",
        "0022.dependency_churn",
        "0023.release_trigger_new_rows",
        "0024.workflow_members",
        "0025.continuation_lease",
    ]
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT id, payload FROM jobrun.jobs").fetchall() == before
        assert c.execute("SELECT count(*) FROM jobrun.job_events").fetchone() == (1,)
        assert c.execute("SELECT count(*) FROM jobrun.processed_effects").fetchone() == (1,)
        assert c.execute("SELECT queue FROM jobrun.queue_pauses").fetchall() == [("emails",)]
        ids = {r[0] for r in c.execute("SELECT migration_id FROM jobrun._yoyo_migration")}
        assert ids == {"0001.initial", "0002.queue_pauses", *applied}
        left = c.execute("SELECT migration_id FROM public._yoyo_migration").fetchall()
        assert left == [("0001.app_tables",)]
    assert not (JOBRUN_TABLES & _tables(empty_dsn, "public"))
    assert m.migrate(empty_dsn) == []


def test_an_adopted_database_has_the_schema_of_a_fresh_one(empty_dsn: str, pg_server: Any) -> None:
    _migrate_like_jobrun_0_1(empty_dsn)
    m.migrate(empty_dsn)
    assert _public_objects(empty_dsn) == set()  # nobody else's bookkeeping: gone with ours
    fresh = pg_server.create_database(template=None)
    try:
        m.migrate(pg_server.dsn(fresh))
        assert _schema_fingerprint(empty_dsn) == _schema_fingerprint(pg_server.dsn(fresh))
    finally:
        pg_server.drop_database(fresh)


def test_migrate_into_a_schema_of_another_name(empty_dsn: str) -> None:
    m.migrate(empty_dsn, schema="acme_jobs")
    assert JOBRUN_TABLES | {"_yoyo_migration", "schema_version"} <= _tables(empty_dsn, "acme_jobs")
    assert not _tables(empty_dsn, "jobrun")
    assert _public_objects(empty_dsn) == set()
    assert m.pending(empty_dsn, schema="acme_jobs") == []
    assert m.migrate(empty_dsn, schema="acme_jobs") == []


@pytest.mark.parametrize("bad", ["public", "pg_jobs", "Jobs", "a-b", "", "x" * 64])
def test_a_schema_name_that_is_not_a_plain_name_of_its_own_is_refused(
    empty_dsn: str, bad: str
) -> None:
    with pytest.raises(ValidationError, match="schema"):
        m.migrate(empty_dsn, schema=bad)
    assert _public_objects(empty_dsn) == set()


def test_migrate_leaves_no_error_in_the_server_log(empty_dsn: str, pg_server: Any) -> None:
    if pg_server.cluster is None:
        pytest.skip("the server log is only readable for a cluster the suite started")
    before = len(pg_server.cluster.server_log())
    m.migrate(empty_dsn)
    m.migrate(empty_dsn)  # nothing to apply: still nothing logged
    logged = pg_server.cluster.server_log()[before:]
    assert "ERROR" not in logged, logged


def test_the_migration_sql_script_builds_the_schema_migrate_builds(
    empty_dsn: str, pg_server: Any
) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(m.migration_sql())  # type: ignore[call-overload]
    fresh = pg_server.create_database(template=None)
    try:
        m.migrate(pg_server.dsn(fresh))
        assert _schema_fingerprint(empty_dsn) == _schema_fingerprint(pg_server.dsn(fresh))
    finally:
        pg_server.drop_database(fresh)
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (
            SCHEMA_VERSION,
        )


def test_the_migration_sql_script_names_the_chosen_schema() -> None:
    script = m.migration_sql("acme_jobs")
    assert "CREATE SCHEMA IF NOT EXISTS acme_jobs" in script
    code = "\n".join(line.split("--")[0] for line in script.splitlines())
    assert '"acme_jobs".jobs' in code and "jobrun." not in code


def test_the_code_needs_the_version_the_last_migration_writes() -> None:
    forward = sorted(p for p in MIGRATIONS.glob("*.sql") if not p.name.endswith(".rollback.sql"))
    last = forward[-1]
    assert int(last.name[:4]) == SCHEMA_VERSION
    for path in forward:
        if int(path.name[:4]) >= 4:
            assert f"{int(path.name[:4])})" in path.read_text() or (
                f"version = {int(path.name[:4])}" in path.read_text()
            ), f"{path.name} does not write its version into schema_version"


def test_events_cost_one_btree_entry_and_pruning_deletes_only_old_events_in_batches(
    empty_dsn: str,
) -> None:
    # Migration 0009: `at` is a BRIN index; 0014: no primary key either, so an
    # event enters one B-tree (its job's timeline) and PruneEvents finds old
    # events through the BRIN index, at most max_events per call.
    m.migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        indexes = dict(
            c.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'jobrun'"
                " AND tablename = 'job_events'"
            ).fetchall()
        )
        assert set(indexes) == {"job_events_job_idx", "job_events_at_idx"}, indexes
        assert "USING brin (at)" in indexes["job_events_at_idx"]
        c.execute(
            "INSERT INTO jobrun.job_events (job_id, kind, at)"
            " SELECT gen_random_uuid(), 'enqueued', now() - make_interval(days => 30 - g)"
            " FROM generate_series(1, 20) g"
        )
        from jobrun.postgres.sqlc import Queries  # noqa: PLC0415

        young = {
            r[0]
            for r in c.execute(
                "SELECT id FROM jobrun.job_events WHERE at > now() - interval '14.5 days'"
            )
        }
        assert len(young) == 5  # 14 days old down to 10: kept at any batch size
        assert Queries().prune_events(c, age_seconds=86400 * 14.5, max_events=5) == 5
        assert Queries().prune_events(c, age_seconds=86400 * 14.5, max_events=5) == 5
        assert Queries().prune_events(c, age_seconds=86400 * 14.5, max_events=100) == 5
        assert Queries().prune_events(c, age_seconds=86400 * 14.5, max_events=100) == 0
        assert {r[0] for r in c.execute("SELECT id FROM jobrun.job_events")} == young


def test_upgrading_to_the_release_column_keeps_the_count_a_queued_job_carried_in_its_error(
    empty_dsn: str,
) -> None:
    # Migration 0011: the unknown-type release count moved from last_error's
    # prose to jobs.releases; a job released three times before the upgrade
    # keeps its three, so the upgrade grants no fresh allowance.
    m.migrate(empty_dsn)
    rollback = (MIGRATIONS / "0011.release_count.rollback.sql").read_text()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(rollback)
        c.execute("DELETE FROM jobrun._yoyo_migration WHERE migration_id = '0011.release_count'")
        prose = (
            "no handler for job type 'mail.send' (release 3 of 24, attempt not counted); "
            "worker w1 knows: none"
        )
        for state, error in [("queued", prose), ("queued", "boom"), ("dead", prose)]:
            c.execute(
                "INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, last_error,"
                " finished_at) VALUES (gen_random_uuid(), 'q', 'mail.send', '{}', '{}', %s, %s,"
                " CASE WHEN %s = 'dead' THEN now() END)",
                [state, error, state],
            )
    assert m.migrate(empty_dsn) == ["0011.release_count"]
    with psycopg.connect(empty_dsn) as c:
        rows = c.execute(
            "SELECT state::text, last_error, releases FROM jobrun.jobs"
            " ORDER BY releases DESC, state"
        ).fetchall()
    assert rows == [("queued", prose, 3), ("dead", prose, 0), ("queued", "boom", 0)]


def _jobs_storage(dsn: str) -> tuple[set[str], list[str]]:
    with psycopg.connect(dsn) as c:
        indexes = {
            r[0]
            for r in c.execute(
                "SELECT indexrelid::regclass::text FROM pg_index"
                " WHERE indrelid = 'jobrun.jobs'::regclass"
            ).fetchall()
        }
        row = c.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'jobrun.jobs'::regclass"
        ).fetchone()
    assert row is not None
    return indexes, sorted(row[0] or [])


def test_the_churn_migration_rolls_back_to_both_leased_indexes_and_fillfactor_85(
    empty_dsn: str,
) -> None:
    # Migration 0012: one index of the leased rows, and the storage
    # parameters of a queue's churn; its rollback gives back what 0011 had.
    m.migrate(empty_dsn)
    indexes, options = _jobs_storage(empty_dsn)
    assert "jobrun.jobs_leased_idx" not in indexes and "jobrun.jobs_leased_queue_idx" in indexes
    assert "fillfactor=70" in options and "autovacuum_vacuum_scale_factor=0.02" in options
    rollback = (MIGRATIONS / "0012.queue_churn.rollback.sql").read_text()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(rollback)
        c.execute("DELETE FROM jobrun._yoyo_migration WHERE migration_id = '0012.queue_churn'")
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (11,)
    indexes, options = _jobs_storage(empty_dsn)
    assert {"jobrun.jobs_leased_idx", "jobrun.jobs_leased_queue_idx"} <= indexes
    assert options == ["fillfactor=85"]
    assert m.migrate(empty_dsn) == ["0012.queue_churn"]
    assert _jobs_storage(empty_dsn)[1] == sorted(
        [
            "fillfactor=70",
            "autovacuum_vacuum_scale_factor=0.02",
            "autovacuum_vacuum_threshold=1000",
            "autovacuum_analyze_scale_factor=0.05",
            "autovacuum_vacuum_cost_limit=2000",
        ]
    )


def test_the_workflows_migration_rewrites_no_jobs_and_rolls_back(empty_dsn: str) -> None:
    # Migration 0016 adds columns with constant defaults (a catalog change),
    # new tables and a trigger: the jobs table keeps its file (no rewrite),
    # and a rollback then a new migrate land where a fresh database does
    # (the enum value 'waiting' stays: ADD VALUE IF NOT EXISTS).
    m.migrate(empty_dsn)
    rollback = (MIGRATIONS / "0016.workflows.rollback.sql").read_text()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        # 0020 replaced 0016's trigger: it goes back first.
        c.execute((MIGRATIONS / "0020.release_by_statement.rollback.sql").read_text())
        c.execute(
            "DELETE FROM jobrun._yoyo_migration WHERE migration_id = '0020.release_by_statement'"
        )
        c.execute(rollback)
        c.execute("DELETE FROM jobrun._yoyo_migration WHERE migration_id = '0016.workflows'")
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (15,)
        c.execute(
            "INSERT INTO jobrun.jobs (id, queue, type, payload, backoff)"
            " SELECT gen_random_uuid(), 'q', 't', '{}', '{}' FROM generate_series(1, 100)"
        )
        before = c.execute("SELECT pg_relation_filenode('jobrun.jobs')").fetchone()
    assert "job_dependencies" not in _tables(empty_dsn)
    assert m.migrate(empty_dsn) == ["0016.workflows", "0020.release_by_statement"]
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT pg_relation_filenode('jobrun.jobs')").fetchone() == before
        row = c.execute(
            "SELECT count(*) FILTER (WHERE pending_parents = 0 AND NOT has_dependents"
            " AND on_parent_failure IS NULL) FROM jobrun.jobs"
        ).fetchone()
        assert row == (100,)
    assert {"job_dependencies", "workflows"} <= _tables(empty_dsn)


def test_the_workers_migration_adds_one_table_and_rolls_back_to_none(empty_dsn: str) -> None:
    # Migration 0013 creates jobrun.workers and touches no other table: no
    # lock on jobs, so it takes as long at a million jobs as on none.
    m.migrate(empty_dsn)
    assert "workers" in _tables(empty_dsn)
    text = (MIGRATIONS / "0013.workers.sql").read_text()
    statements = [line for line in text.splitlines() if line and not line.startswith("--")]
    assert not any("jobrun.jobs" in line for line in statements)
    rollback = (MIGRATIONS / "0013.workers.rollback.sql").read_text()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(rollback)
        c.execute("DELETE FROM jobrun._yoyo_migration WHERE migration_id = '0013.workers'")
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (12,)
    assert "workers" not in _tables(empty_dsn)
    assert m.migrate(empty_dsn) == ["0013.workers"]
    assert "workers" in _tables(empty_dsn)


def test_the_steps_migration_adds_two_tables_and_rolls_back_to_none(empty_dsn: str) -> None:
    # Migration 0015 creates job_steps and job_fences and touches no other
    # table (no foreign key to jobs): no lock on jobs, so it takes as long at
    # a million jobs as on none.
    m.migrate(empty_dsn)
    assert {"job_steps", "job_fences"} <= _tables(empty_dsn)
    text = (MIGRATIONS / "0015.steps.sql").read_text()
    statements = [line for line in text.splitlines() if line and not line.startswith("--")]
    assert not any("jobrun.jobs" in line for line in statements)
    rollback = (MIGRATIONS / "0015.steps.rollback.sql").read_text()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(rollback)
        c.execute("DELETE FROM jobrun._yoyo_migration WHERE migration_id = '0015.steps'")
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (14,)
    assert not {"job_steps", "job_fences"} & _tables(empty_dsn)
    assert m.migrate(empty_dsn) == ["0015.steps"]


def test_the_signals_migration_adds_two_tables_and_rolls_back_to_none(empty_dsn: str) -> None:
    # Migration 0017 creates job_waits and job_signals and touches no other
    # table (no foreign key to jobs): no lock on jobs, as long at a million
    # jobs as on none.
    m.migrate(empty_dsn)
    assert {"job_waits", "job_signals"} <= _tables(empty_dsn)
    text = (MIGRATIONS / "0017.signals.sql").read_text()
    statements = [line for line in text.splitlines() if line and not line.startswith("--")]
    assert not any("jobrun.jobs" in line for line in statements)
    rollback = (MIGRATIONS / "0017.signals.rollback.sql").read_text()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        # 0019 first, as a rollback goes (its workflow_signals draws from
        # job_signals' sequence).
        c.execute((MIGRATIONS / "0019.workflow_signals.rollback.sql").read_text())
        c.execute("DELETE FROM jobrun._yoyo_migration WHERE migration_id = '0019.workflow_signals'")
        c.execute(rollback)
        c.execute("DELETE FROM jobrun._yoyo_migration WHERE migration_id = '0017.signals'")
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (16,)
    assert not {"job_waits", "job_signals"} & _tables(empty_dsn)
    assert m.migrate(empty_dsn) == ["0017.signals", "0019.workflow_signals"]


def test_the_workflow_signals_migration_adds_two_tables_and_rolls_back_to_none(
    empty_dsn: str,
) -> None:
    # Migration 0019 creates workflow_signals and workflow_signal_deliveries
    # and touches no other table: no lock on jobs.
    m.migrate(empty_dsn)
    tables = {"workflow_signals", "workflow_signal_deliveries"}
    assert tables <= _tables(empty_dsn)
    text = (MIGRATIONS / "0019.workflow_signals.sql").read_text()
    statements = [line for line in text.splitlines() if line and not line.startswith("--")]
    assert not any("jobrun.jobs" in line for line in statements)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute((MIGRATIONS / "0019.workflow_signals.rollback.sql").read_text())
        c.execute("DELETE FROM jobrun._yoyo_migration WHERE migration_id = '0019.workflow_signals'")
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (18,)
    assert not tables & _tables(empty_dsn)
    assert m.migrate(empty_dsn) == ["0019.workflow_signals"]


def _roll_back(c: psycopg.Connection[Any], *migrations: str) -> None:
    """Undo ``migrations`` (newest first) as ``jobrun migrate`` would see them undone."""
    for migration in migrations:
        c.execute((MIGRATIONS / f"{migration}.rollback.sql").read_text())
        c.execute("DELETE FROM jobrun._yoyo_migration WHERE migration_id = %s", (migration,))


def test_the_workflow_index_migration_adds_two_indexes_and_rolls_back(empty_dsn: str) -> None:
    # Migration 0018 adds a partial index on jobs (workflow_id IS NOT NULL)
    # and one on workflows (created_at, id): no rewrite of jobs, and a
    # rollback then a new migrate land where a fresh database does (0024
    # then moves the jobs' index to jobrun.workflow_jobs).
    m.migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        before = c.execute("SELECT pg_relation_filenode('jobrun.jobs')").fetchone()
        _roll_back(c, "0024.workflow_members")
        assert c.execute("SELECT to_regclass('jobrun.jobs_workflow_idx')").fetchone() is not None
        _roll_back(c, "0018.workflow_index")
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (17,)
        assert c.execute("SELECT to_regclass('jobrun.jobs_workflow_idx')").fetchone() == (None,)
        assert c.execute("SELECT to_regclass('jobrun.workflows_created_idx')").fetchone() == (None,)
    assert m.migrate(empty_dsn) == ["0018.workflow_index", "0024.workflow_members"]
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT pg_relation_filenode('jobrun.jobs')").fetchone() == before
        row = c.execute("SELECT pg_get_indexdef('jobrun.workflows_created_idx'::regclass)")
        assert "(created_at, id)" in row.fetchone()[0]
        assert c.execute("SELECT to_regclass('jobrun.jobs_workflow_idx')").fetchone() == (None,)
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (24,)


def test_the_workflow_index_built_concurrently_beforehand_is_taken(empty_dsn: str) -> None:
    # docs/upgrading.md: an operator who cannot stop writes for 0018's CREATE
    # INDEX builds it CONCURRENTLY first; the migration then skips it, and
    # 0024 reads the workflows' jobs through it before dropping it.
    m.migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        _roll_back(c, "0024.workflow_members", "0018.workflow_index")
        c.execute(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_workflow_idx ON jobrun.jobs"
            " (workflow_id) WHERE workflow_id IS NOT NULL"
        )
    assert m.migrate(empty_dsn) == ["0018.workflow_index", "0024.workflow_members"]
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regclass('jobrun.jobs_workflow_idx')").fetchone() == (None,)


def test_the_workflow_members_migration_copies_every_workflow_job_and_rolls_back(
    empty_dsn: str,
) -> None:
    # Migration 0024: a workflow enqueued before it keeps all its jobs (one
    # row each in workflow_jobs; a plain job gets none), jobs is not
    # rewritten, and its rollback puts 0018's index back.
    m.migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        _roll_back(c, "0024.workflow_members")
        assert c.execute("SELECT to_regclass('jobrun.workflow_jobs')").fetchone() == (None,)
        flow = uuid.uuid4()
        c.execute("INSERT INTO jobrun.workflows (id, name) VALUES (%s, 'old')", (flow,))
        backoff = json.dumps(DEFAULT_BACKOFF.to_json())
        c.execute(
            "INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, workflow_id,"
            " workflow_node) SELECT gen_random_uuid(), 'q', 't', '{}', %s, %s, 'n' || g"
            " FROM generate_series(1, 3) g",
            (backoff, flow),
        )
        c.execute(
            "INSERT INTO jobrun.jobs (id, queue, type, payload, backoff)"
            " VALUES (gen_random_uuid(), 'q', 't', '{}', %s)",
            (backoff,),
        )
        members = c.execute(
            "SELECT workflow_id, id FROM jobrun.jobs WHERE workflow_id IS NOT NULL ORDER BY id"
        ).fetchall()
        before = c.execute("SELECT pg_relation_filenode('jobrun.jobs')").fetchone()
    assert m.migrate(empty_dsn) == ["0024.workflow_members"]
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert len(members) == 3
        assert (
            c.execute(
                "SELECT workflow_id, job_id FROM jobrun.workflow_jobs ORDER BY job_id"
            ).fetchall()
            == members
        )
        assert c.execute("SELECT to_regclass('jobrun.jobs_workflow_idx')").fetchone() == (None,)
        assert c.execute("SELECT pg_relation_filenode('jobrun.jobs')").fetchone() == before
        _roll_back(c, "0024.workflow_members")
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (23,)
        assert c.execute("SELECT to_regclass('jobrun.workflow_jobs')").fetchone() == (None,)
        assert c.execute("SELECT to_regclass('jobrun.jobs_workflow_idx')").fetchone() is not None
    assert m.migrate(empty_dsn) == ["0024.workflow_members"]


def test_the_statement_release_migration_rolls_back_to_the_row_trigger(empty_dsn: str) -> None:
    # Migration 0020 swaps 0016's row trigger for one per statement (a
    # catalog change: jobs keeps its file); its rollback puts the row
    # trigger back, and a new migrate lands where a fresh database does.
    m.migrate(empty_dsn)
    trigger = (
        "SELECT tgtype & 1 FROM pg_trigger WHERE tgname = 'jobs_release_dependents'"
        " AND tgrelid = 'jobrun.jobs'::regclass"
    )
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        before = c.execute("SELECT pg_relation_filenode('jobrun.jobs')").fetchone()
        assert c.execute(trigger).fetchone() == (0,)  # FOR EACH STATEMENT
        c.execute((MIGRATIONS / "0020.release_by_statement.rollback.sql").read_text())
        c.execute(
            "DELETE FROM jobrun._yoyo_migration WHERE migration_id = '0020.release_by_statement'"
        )
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (19,)
        assert c.execute(trigger).fetchone() == (1,)  # FOR EACH ROW
        assert c.execute("SELECT to_regproc('jobrun.parents_finished')").fetchone() == (None,)
    assert m.migrate(empty_dsn) == ["0020.release_by_statement"]
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT pg_relation_filenode('jobrun.jobs')").fetchone() == before
        assert c.execute(trigger).fetchone() == (0,)
        assert c.execute("SELECT version FROM jobrun.schema_version").fetchone() == (20,)


def test_the_least_privilege_table_list_names_every_table_of_the_schema(empty_dsn: str) -> None:
    # The fault suite grants its runtime role exactly tests.support.tables's
    # list; a table a migration adds must be named there (and granted by an
    # operator who grants table by table: docs/upgrading.md), or real
    # least-privilege workers fail where the fault suite, run only in CI,
    # would say so too late.
    from tests.support.tables import JOBRUN_TABLES  # noqa: PLC0415

    m.migrate(empty_dsn)
    tables = {t for t in _tables(empty_dsn) if not t.startswith("_yoyo")}
    assert tables == set(JOBRUN_TABLES)
