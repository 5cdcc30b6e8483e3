"""The error translator and the transaction runner, provoked for real."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import OutcomeUnknown, TransientError
from jobrun.job.model import NewJob, State
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, counts, new_job

KILL_AT_COMMIT = """
CREATE FUNCTION kill_me() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_terminate_backend(pg_backend_pid());
    PERFORM pg_sleep(5);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER kill_at_commit AFTER INSERT ON jobrun.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.type = 'kill.at.commit') EXECUTE FUNCTION kill_me();
"""


def test_a_deadlock_is_retried_once_inside_the_method(
    store: Store, conn: Any, admin_dsn: str
) -> None:
    conn.execute("CREATE TABLE a (x int); CREATE TABLE b (x int)")
    calls: list[int] = []
    other_has_b = threading.Event()
    other_done = threading.Event()

    def other() -> None:
        # Superuser only: this side waits 10 s before checking for a deadlock,
        # so the store's side (the default 1 s) detects it and is aborted.
        with psycopg.connect(admin_dsn) as c:
            c.execute("SET deadlock_timeout = '10s'")
            c.execute("LOCK TABLE b")
            other_has_b.set()
            c.execute("LOCK TABLE a")  # waits for the store's transaction
            c.commit()
        other_done.set()

    def fn(c: psycopg.Connection[Any]) -> str:
        calls.append(1)
        c.execute("LOCK TABLE a")
        if len(calls) == 1:
            threading.Thread(target=other).start()
            assert other_has_b.wait(10)
            c.execute("LOCK TABLE b")  # deadlock: we detect it first and are aborted
        return "done"

    assert store._with_tx(fn) == "done"
    assert len(calls) == 2
    assert other_done.wait(15)


def test_a_connection_killed_inside_complete_is_transient_and_nothing_commits(
    store: Store, conn: Any
) -> None:
    conn.execute("CREATE TABLE side (x int)")
    store.enqueue(new_job())
    job = store.claim("w", ["default"], 1, TTL)[0]

    def commit(c: psycopg.Connection[Any]) -> None:
        c.execute("INSERT INTO side VALUES (1)")
        # The server's pid, asked of the server: behind a pooler the one the
        # connection was given at login is the pooler's.
        pid = c.execute("SELECT pg_backend_pid()").fetchone()
        assert pid is not None
        conn.execute("SELECT pg_terminate_backend(%s)", [pid[0]])
        c.execute("SELECT 1")

    with pytest.raises(TransientError):
        store.complete(job, commit)
    assert conn.execute("SELECT count(*) FROM side").fetchone() == (0,)
    assert store.get(job.id).state is State.LEASED
    assert store.complete(job).state is State.SUCCEEDED  # the pool recovered


def test_a_connection_lost_during_commit_is_outcome_unknown(store: Store, conn: Any) -> None:
    conn.execute(KILL_AT_COMMIT)
    before = counts(conn)
    with pytest.raises(OutcomeUnknown):
        store.enqueue_batch([NewJob(type="kill.at.commit"), new_job()])
    with pytest.raises(OutcomeUnknown):
        store.enqueue(NewJob(type="kill.at.commit"))
    assert counts(conn) == before
    assert store.enqueue(new_job()).state is State.QUEUED


def test_a_read_only_server_is_a_transient_error(dsn: str, conn: Any) -> None:
    dbname = conn.info.dbname
    conn.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
    pool = open_pool(dsn, concurrency=1)
    try:
        store = Store(pool)
        with pytest.raises(TransientError, match="read-only"):
            store.enqueue(new_job())
        with pytest.raises(TransientError, match="read-only"):
            store.enqueue_batch([new_job()])
    finally:
        pool.close()
        conn.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
    assert counts(conn) == (0, 0, 0)


def test_pool_exhaustion_is_a_bounded_transient_error(dsn: str) -> None:
    pool = open_pool(dsn, min_size=1, max_size=1, timeout=0.5)
    try:
        store = Store(pool)
        with pool.connection(), pytest.raises(TransientError, match="no database connection"):
            store.enqueue(new_job())
        assert store.enqueue(new_job()).state is State.QUEUED
    finally:
        pool.close()


def test_after_a_restart_stale_pooled_connections_are_replaced_without_errors() -> None:
    from jobrun.postgres.embedded import throwaway_cluster  # noqa: PLC0415
    from jobrun.postgres.migrate import migrate  # noqa: PLC0415

    with throwaway_cluster() as cluster:
        cluster.ensure_database("jobrun")
        url = cluster.dsn("jobrun")
        migrate(url)
        pool = open_pool(url, concurrency=4, min_size=12)
        try:
            store = Store(pool)
            pool.wait(10)
            store.enqueue(new_job())
            cluster.restart("fast")
            for _ in range(20):  # more calls than stale connections: none fails
                store.enqueue(new_job())
            assert len(store.list(limit=100)) == 21
        finally:
            pool.close()


def test_a_call_on_a_half_open_connection_is_bounded_client_side(dsn: str) -> None:
    """The server never answers (a stalled link the kernel still acknowledges)."""
    from jobrun.postgres.deadline import WATCHDOG  # noqa: PLC0415
    from tests.support.proxy import TcpProxy  # noqa: PLC0415

    with TcpProxy(dsn) as proxy:
        pool = open_pool(proxy.conninfo, min_size=1, max_size=2)
        try:
            store = Store(pool, call_timeout=dt.timedelta(seconds=1))
            store.now()
            fired = WATCHDOG.fired
            proxy.blackhole()
            with pytest.raises((TransientError, OutcomeUnknown)):
                store.enqueue(new_job())
            assert WATCHDOG.fired == fired + 1
            assert store.now() is not None  # a fresh connection, through the proxy again
        finally:
            pool.close()


def test_a_call_inside_bounded_is_given_up_at_the_callers_deadline(dsn: str) -> None:
    """``Store.bounded`` cuts the store's own bounds (here 30 s) to the caller's
    deadline, and a call begun past it is refused before anything is sent."""
    import time  # noqa: PLC0415

    from tests.support.proxy import TcpProxy  # noqa: PLC0415

    with TcpProxy(dsn) as proxy:
        pool = open_pool(proxy.conninfo, min_size=1, max_size=2)
        try:
            slow = dt.timedelta(seconds=30)
            store = Store(pool, call_timeout=slow, commit_timeout=slow)
            store.enqueue(new_job())
            [job] = store.claim("w", ["default"], 1, TTL)
            proxy.blackhole()
            began = time.monotonic()
            with pytest.raises((TransientError, OutcomeUnknown)), store.bounded(0.5):
                store.complete(job, lambda conn: None)
            assert time.monotonic() - began < 2.0
            with pytest.raises(TransientError, match="deadline"), store.bounded(0.1):
                time.sleep(0.2)
                store.now()
            assert store.get(job.id).state is State.LEASED  # nothing committed
        finally:
            pool.close()


def test_a_transaction_a_call_leaves_open_is_committed_or_rolled_back_on_return(
    store: Store, conn: Any
) -> None:
    # The checkout returns the connection as psycopg's `with conn:` would: a
    # transaction still open is committed when the call succeeded and rolled
    # back when it failed, so the next call never finds it.
    conn.execute("CREATE TABLE left_open (x int)")

    def leave_open(value: int, fail: bool) -> Any:
        def fn(c: psycopg.Connection[Any], committing: list[bool]) -> None:
            c.execute("BEGIN")
            c.execute("INSERT INTO left_open VALUES (%s)", [value])
            if fail:
                raise RuntimeError("the body failed")

        return fn

    store._run(leave_open(1, False), timeout=5.0)
    with pytest.raises(RuntimeError, match="the body failed"):
        store._run(leave_open(2, True), timeout=5.0)
    assert conn.execute("SELECT array_agg(x) FROM left_open").fetchone() == ([1],)
    idle = [
        store._on_pool_read(lambda c: c.info.transaction_status)
        for _ in range(store.pool.max_size + 1)
    ]
    assert set(idle) == {psycopg.pq.TransactionStatus.IDLE}
