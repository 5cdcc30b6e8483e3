"""jobrun's own schema: a caller's search_path never matters, and a wrong version fails fast."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import SchemaMismatch
from jobrun.job.model import NewJob, ScheduleSpec, State
from jobrun.postgres.pool import open_pool
from jobrun.postgres.schema import SCHEMA_VERSION
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL


@pytest.fixture
def app_jobs_table(conn: psycopg.Connection[Any]) -> None:
    """The application's own ``public.jobs``, as many applications have one."""
    conn.execute("CREATE TABLE public.jobs (id serial PRIMARY KEY, title text)")
    conn.execute("INSERT INTO public.jobs (title) VALUES ('plumber')")


@pytest.mark.parametrize("search_path", ["pg_catalog", "public", "pg_catalog,public"])
def test_a_store_whose_connections_leave_jobrun_off_the_search_path_still_works(
    dsn: str, conn: psycopg.Connection[Any], app_jobs_table: None, search_path: str
) -> None:
    pool = open_pool(
        psycopg.conninfo.make_conninfo(dsn, options=f"-c search_path={search_path}"), max_size=3
    )
    try:
        store = Store(pool)
        with pool.connection() as c:
            assert "jobrun" not in c.execute("SHOW search_path").fetchone()[0]  # type: ignore[index]
        store.enqueue(NewJob(type="t", idempotency_key="k"))
        store.enqueue(NewJob(type="t", idempotency_key="k"))  # a replay
        store.enqueue_batch([NewJob(type="t") for _ in range(3)])
        first, second, *_ = store.claim("w", ["default"], 5, TTL)
        assert first.lease_token is not None
        store.heartbeat("w", [(first.id, first.lease_token)], store.now() + TTL)
        store.complete(first, lambda c: None)
        store.fail(second, "boom", None)
        store.complete_many(store.claim("w", ["default"], 5, TTL))
        store.create_schedule(ScheduleSpec(id="s", cron="* * * * *", type="t", payload={}))
        assert (
            store.materialize(
                store.due_schedules(store.now() + dt.timedelta(minutes=2), 5)[0],
                store.now() + dt.timedelta(minutes=2),
            )
            is not None
        )
        assert store.events(first.id) and store.depth() and store.list(limit=10)
        store.check_schema()
    finally:
        pool.close()
    assert conn.execute("SELECT title FROM public.jobs").fetchall() == [("plumber",)]


@pytest.mark.parametrize("search_path", ["''", "public"])
def test_a_transactional_enqueue_works_whatever_the_callers_search_path(
    store: Store,
    admin_dsn: str,
    conn: psycopg.Connection[Any],
    app_jobs_table: None,
    search_path: str,
) -> None:
    with psycopg.connect(admin_dsn) as c:
        c.execute(f"SET search_path = {search_path}")
        (before,) = c.execute("SHOW search_path").fetchone()  # type: ignore[misc]
        c.execute("INSERT INTO public.jobs (title) VALUES ('electrician')")
        job = store.enqueue(NewJob(type="t"), conn=c)
        batch = store.enqueue_batch(
            [NewJob(type="t"), NewJob(type="t", idempotency_key="b")], conn=c
        )
        assert c.execute("SHOW search_path").fetchone() == (before,)
        c.commit()
    assert store.get(job.id).state is State.QUEUED and batch.inserted == 2
    titles = conn.execute("SELECT title FROM public.jobs ORDER BY id").fetchall()
    assert titles == [("plumber",), ("electrician",)]


def test_check_schema_passes_on_a_current_schema(store: Store) -> None:
    assert store.schema_version() == SCHEMA_VERSION
    store.check_schema()


@pytest.fixture
def empty_store(empty_dsn: str) -> Iterator[Store]:
    pool = open_pool(empty_dsn, max_size=2)
    try:
        yield Store(pool)
    finally:
        pool.close()


def test_a_missing_schema_is_one_clear_error(empty_store: Store) -> None:
    assert empty_store.schema_version() is None
    with pytest.raises(SchemaMismatch) as caught:
        empty_store.check_schema()
    assert caught.value.found is None
    assert str(caught.value) == "the jobrun schema 'jobrun' is missing: run 'jobrun migrate'"


def test_an_older_schema_names_both_versions_and_the_fix(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("UPDATE jobrun.schema_version SET version = %s", [SCHEMA_VERSION - 1])
    with pytest.raises(SchemaMismatch, match="run 'jobrun migrate'") as caught:
        store.check_schema()
    assert (caught.value.found, caught.value.needed) == (SCHEMA_VERSION - 1, SCHEMA_VERSION)
    assert f"version {SCHEMA_VERSION - 1}, this jobrun needs {SCHEMA_VERSION}" in str(caught.value)


def test_a_newer_schema_says_to_upgrade_jobrun(store: Store, conn: psycopg.Connection[Any]) -> None:
    conn.execute("UPDATE jobrun.schema_version SET version = %s", [SCHEMA_VERSION + 1])
    with pytest.raises(SchemaMismatch, match=r"newer than this jobrun knows .*upgrade jobrun"):
        store.check_schema()


def test_a_store_in_a_schema_of_another_name_keeps_every_row_there(
    empty_dsn: str, pg_server: Any
) -> None:
    """jobrun migrated into ``acme_jobs``: every statement goes there, nothing elsewhere."""
    from jobrun.postgres.migrate import migrate  # noqa: PLC0415

    migrate(empty_dsn, schema="acme_jobs")
    pool = open_pool(empty_dsn, max_size=3)
    try:
        store = Store(pool, schema="acme_jobs")
        store.check_schema()
        store.enqueue(NewJob(type="t", idempotency_key="k"))
        store.enqueue_batch([NewJob(type="t") for _ in range(3)])
        jobs = store.claim("w", ["default"], 10, TTL)
        store.complete(jobs[0], lambda c: None)
        store.complete_many(jobs[1:3])
        store.fail(jobs[3], "x", None)
        store.pause_queue("q")
        assert store.resume_queue("q")
        store.create_schedule(ScheduleSpec(id="s", cron="* * * * *", type="t", payload={}))
        assert len(store.list(limit=10)) == 4 and store.events(jobs[0].id)
        assert store.effect_done(jobs[0])
    finally:
        pool.close()
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT count(*) FROM acme_jobs.jobs").fetchone() == (4,)
        assert c.execute("SELECT to_regnamespace('jobrun')").fetchone() == (None,)
    with pytest.raises(SchemaMismatch, match="'jobrun' is missing"):
        pool = open_pool(empty_dsn, max_size=1)
        try:
            Store(pool).check_schema()
        finally:
            pool.close()


def test_a_store_refuses_a_schema_name_that_is_not_plain(pool: Any) -> None:
    from jobrun.job.errors import ValidationError  # noqa: PLC0415

    for bad in ("public", "Acme", "acme;drop", "pg_x", ""):
        with pytest.raises(ValidationError, match="schema"):
            Store(pool, schema=bad)


def test_a_role_that_may_not_read_the_schema_is_told_what_to_grant(
    conn: psycopg.Connection[Any], admin_dsn: str
) -> None:
    from jobrun.job.errors import DatabaseError  # noqa: PLC0415

    conn.execute("DROP ROLE IF EXISTS jobrun_nobody")
    conn.execute("CREATE ROLE jobrun_nobody LOGIN PASSWORD 'nobody-pw'")
    try:
        dsn = psycopg.conninfo.make_conninfo(admin_dsn, user="jobrun_nobody", password="nobody-pw")
        pool = open_pool(dsn, max_size=1)
        try:
            with pytest.raises(DatabaseError, match=r"grant it USAGE on schema jobrun"):
                Store(pool).check_schema()
        finally:
            pool.close()
    finally:
        conn.execute("DROP OWNED BY jobrun_nobody")
        conn.execute("DROP ROLE jobrun_nobody")


def test_the_schema_check_keeps_to_the_call_bound_not_a_database_wide_statement_timeout(
    dsn: str, database: str, conn: psycopg.Connection[Any]
) -> None:
    """A worker starts even when the database's statement_timeout is tiny: the
    check waits out a lock (standing in for a cold catalog on a slow machine)
    under jobrun's call bound, and the session keeps the database's setting."""
    conn.execute(f"ALTER DATABASE \"{database}\" SET statement_timeout = '50ms'")
    pool = open_pool(dsn, max_size=1)
    try:
        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE jobrun.schema_version IN ACCESS EXCLUSIVE MODE")
            release = threading.Timer(0.5, locker.rollback)
            release.start()
            started = time.monotonic()
            Store(pool, call_timeout=dt.timedelta(seconds=10)).check_schema()
            assert time.monotonic() - started >= 0.4  # it waited for the lock
            release.join()
        with pool.connection() as c:
            assert c.execute("SHOW statement_timeout").fetchone() == ("50ms",)
    finally:
        conn.execute(f'ALTER DATABASE "{database}" RESET statement_timeout')
        pool.close()
