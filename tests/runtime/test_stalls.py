"""A stuck loop says so: the worker's stall watch, against real PostgreSQL.

Each scenario blocks one loop for real (a row lock, an exhausted pool, a
half-open listener connection) and expects a WARNING that names the loop,
what it was doing and where its thread waits, then an INFO line once it moves
again.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobrun.job.model import Backoff, Job, NewJob, State
from jobrun.postgres.notify import Notifier
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry, Worker, WorkerConfig
from tests.runtime.conftest import FAST
from tests.support.proxy import TcpProxy
from tests.support.waiting import wait_for

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)
STALL = dt.timedelta(milliseconds=500)


def warnings_about(caplog: pytest.LogCaptureFixture, loop: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith(f"{loop} has been stuck")
    ]


def moving_again(caplog: pytest.LogCaptureFixture, loop: str) -> bool:
    return any(r.getMessage().startswith(f"{loop} is moving again") for r in caplog.records)


def test_a_completer_blocked_on_a_row_lock_says_so_and_where(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
    admin_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobrun")
    conn.execute("CREATE TABLE gate (id int PRIMARY KEY)")
    conn.execute("INSERT INTO gate VALUES (1)")

    def handler(ctx: JobContext, job: Job) -> Callable[[psycopg.Connection[Any]], None]:
        return lambda c: c.execute("SELECT 1 FROM gate WHERE id = 1 FOR UPDATE")

    registry.register("t", handler)
    with psycopg.connect(admin_dsn) as holder:
        holder.execute("SELECT 1 FROM gate WHERE id = 1 FOR UPDATE")  # the completer waits
        job = store.enqueue(NewJob(type="t", backoff=NO_WAIT))
        worker = make_worker(stall_warning=STALL)
        [warning] = wait_for(lambda: warnings_about(caplog, "jobrun-completer")[:1], 10)
        assert "with a commit callable" in warning  # what it is doing
        assert "wait (connection.py" in warning  # where it waits: on the server's answer
        assert "<lambda> (test_stalls.py" in warning  # inside the commit callable
        assert "jobrun-completer" in worker.stalled_loops
        holder.rollback()
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)
    wait_for(lambda: moving_again(caplog, "jobrun-completer"), 10)
    assert worker.stalled_loops == {}
    assert not warnings_about(caplog, "jobrun-claimer")


def test_a_claimer_waiting_for_a_pool_with_no_free_connection_says_so(
    dsn: str, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobrun")
    registry.register("t", lambda ctx, job: None)
    pool = open_pool(dsn, max_size=1, timeout=30.0)
    store = Store(pool)
    job = store.enqueue(NewJob(type="t", backoff=NO_WAIT))
    held = pool.getconn()  # the pool's only connection: every call waits for it
    worker = Worker(store, registry, WorkerConfig(**FAST, stall_warning=STALL))
    try:
        worker.start()
        [warning] = wait_for(lambda: warnings_about(caplog, "jobrun-claimer")[:1], 10)
        # Its first call: the queues' limits (cached for a second), before any claim.
        assert "reading the limits of its queues" in warning
        assert "getconn (pool.py" in warning  # waiting for a pooled connection
        pool.putconn(held)
        wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)
        wait_for(lambda: moving_again(caplog, "jobrun-claimer"), 10)
    finally:
        worker.stop(timeout=5)
        pool.close()


@pytest.fixture
def proxied_notifier(dsn: str) -> Iterator[tuple[TcpProxy, Notifier]]:
    with TcpProxy(dsn) as proxy:
        notifier = Notifier(proxy.conninfo, liveness_interval=0.2, probe_timeout=3.0)
        notifier.start()
        try:
            yield proxy, notifier
        finally:
            notifier.stop()


def test_a_listener_whose_probe_hangs_on_a_half_open_connection_says_so(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    proxied_notifier: tuple[TcpProxy, Notifier],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobrun")
    proxy, notifier = proxied_notifier
    registry.register("t", lambda ctx, job: None)
    assert notifier.wait_connected(10)
    worker = make_worker(dispatcher=notifier, stall_warning=dt.timedelta(seconds=1))
    assert proxy.blackhole("jobrun-listener") == 1
    [warning] = wait_for(lambda: warnings_about(caplog, "jobrun-listener")[:1], 10)
    assert "probing its session" in warning
    assert "_probe (notify.py" in warning
    # The probe's own bound ends the step; the listener reconnects and moves on.
    wait_for(lambda: moving_again(caplog, "jobrun-listener"), 15)
    wait_for(lambda: notifier.stats.reconnects >= 1, 15)
    job = store.enqueue(NewJob(type="t", backoff=NO_WAIT))
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)
    assert worker.stalled_loops == {}
