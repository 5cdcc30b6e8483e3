"""A full NOTIFY queue never stops enqueues: the row is the truth, the wake-up a hint.

PostgreSQL keeps every notification until the slowest listener has read it.
A session that LISTENs and then sits idle in an open transaction reads
nothing, so the queue (``max_notify_queue_pages``, 8 GB by default) fills,
and from then on every COMMIT that notifies fails with "too many
notifications in the NOTIFY queue". These tests shrink the queue to 64 pages
(PostgreSQL 17+) on a server of their own and hold it full.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from jobrun.job.model import NewJob, State
from jobrun.postgres.embedded import throwaway_cluster
from jobrun.postgres.migrate import migrate
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import MAX_NOTIFY_QUEUE_USAGE, Store
from tests.support.database import TestServer
from tests.support.waiting import wait_for

CHANNEL = "jobrun_jobs"


@pytest.fixture(scope="module")
def small_queue_dsn(pg_server: TestServer) -> Iterator[str]:
    if pg_server.version < 17:
        pytest.skip("max_notify_queue_pages needs PostgreSQL 17+")
    bindir = pg_server.cluster.bindir if pg_server.cluster else None
    with throwaway_cluster({"max_notify_queue_pages": "64", "fsync": "off"}, bindir) as cluster:
        cluster.ensure_database("jobrun")
        dsn = cluster.dsn("jobrun")
        migrate(dsn)
        yield dsn


@pytest.fixture
def blocker(small_queue_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A session LISTENing on jobrun's channel, then idle in an open transaction."""
    c = psycopg.connect(small_queue_dsn, application_name="the-blocker")
    c.execute(f"LISTEN {CHANNEL}")
    c.commit()
    c.execute("SELECT 1")  # a transaction left open: it reads no notification
    try:
        yield c
    finally:
        c.close()


def fill(dsn: str, until: float) -> float:
    """Send big notifications of our own until the queue is ``until`` full (or full)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        while True:
            (usage,) = c.execute("SELECT pg_notification_queue_usage()").fetchone()  # type: ignore[misc]
            if usage >= until:
                return float(usage)
            try:
                c.execute("SELECT pg_notify(%s, %s)", [CHANNEL, "x" * 7000])
            except psycopg.errors.ProgramLimitExceeded:
                return 1.0


@pytest.fixture
def store(small_queue_dsn: str) -> Iterator[Store]:
    pool = open_pool(small_queue_dsn, max_size=4)
    try:
        store = Store(pool)
        with pool.connection() as c:
            c.execute("TRUNCATE jobrun.jobs, jobrun.job_events")
        yield store
    finally:
        pool.close()


def jobs_in_db(store: Store) -> int:
    return sum(c.jobs for c in store.state_counts().values())


@pytest.mark.parametrize("level", [0.7, 1.0], ids=["filling", "full"])
def test_a_blocked_notify_queue_never_stops_single_batch_or_transactional_enqueues(
    store: Store,
    small_queue_dsn: str,
    blocker: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
    level: float,
) -> None:
    reached = fill(small_queue_dsn, level)
    assert reached >= MAX_NOTIFY_QUEUE_USAGE
    caplog.set_level(logging.WARNING, logger="jobrun.postgres.store")
    one = store.enqueue(NewJob(type="t"))
    keyed = store.enqueue(NewJob(type="t", idempotency_key="k"))
    batch = store.enqueue_batch(
        [NewJob(type="t") for _ in range(50)] + [NewJob(type="t", idempotency_key="b")]
    )
    with psycopg.connect(small_queue_dsn) as c:
        mine = store.enqueue(NewJob(type="t"), conn=c)
        c.commit()
    store.pause_queue("default")
    assert store.resume_queue("default")
    store.cancel(one.id)
    assert store.retry(one.id).state is State.QUEUED
    assert batch.inserted == 51
    assert jobs_in_db(store) == 54
    assert store.get(mine.id).state is State.QUEUED and store.get(keyed.id)
    message = wait_for(
        lambda: next((r.getMessage() for r in caplog.records if "NOTIFY queue" in r.message), None)
    )
    assert f"PID {blocker.info.backend_pid} (the-blocker" in message
    assert "% full" in message and "polling" in message


def test_wake_ups_resume_once_the_blocker_ends_its_transaction(
    store: Store, small_queue_dsn: str, blocker: psycopg.Connection[Any]
) -> None:
    fill(small_queue_dsn, 1.0)
    with psycopg.connect(small_queue_dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        store.enqueue(NewJob(type="t"))
        assert not [n for n in listener.notifies(timeout=0.3) if n.payload == "default"]
        blocker.rollback()  # the queue can drain now
        for _ in listener.notifies(timeout=0.5):  # read what we were sent meanwhile
            pass
        wait_for(lambda: store.enqueue(NewJob(type="t")) and _usage(listener) < 0.5)
        store.enqueue(NewJob(type="t"))
        payloads = [n.payload for n in listener.notifies(timeout=1.0)]
        assert "default" in payloads


def _usage(c: psycopg.Connection[Any]) -> float:
    (usage,) = c.execute("SELECT pg_notification_queue_usage()").fetchone()  # type: ignore[misc]
    for _ in c.notifies(timeout=0.05):
        pass
    return float(usage)
