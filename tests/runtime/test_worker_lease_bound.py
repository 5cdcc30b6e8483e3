"""The completer never waits past the lease it is completing.

A completion stuck on a half-open connection was bounded by the store's
client-side bounds alone (``call_timeout`` + ``commit_timeout``: 40 s by
default) while its lease was a few seconds: the job was reaped and run again
elsewhere long before the worker gave up. The worker now bounds each try by
the lease's end as it reckons it (the claim's or last heartbeat's send time
plus the TTL, on its own monotonic clock) and abandons the completion as
lease lost when it runs out (a batch with commit callables keeps
``commit_timeout`` for its first try: its rows stay locked while the
callables run, which may rightly outlast the lease). In this process, through a TCP proxy that goes
half-open (the fault suite has the real-process variant:
tests/faults/test_network.py).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator

import pytest

from jobrun.job.model import Backoff, Job, NewJob, State
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry, Worker, WorkerConfig
from tests.support.proxy import TcpProxy
from tests.support.waiting import wait_for

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)
LEASE = 3.0
SLOW = dt.timedelta(seconds=30)
"""The store's own bounds: a completion would wait up to 60 s on them alone."""


@pytest.fixture
def proxy(dsn: str) -> Iterator[TcpProxy]:
    p = TcpProxy(dsn)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def proxied(proxy: TcpProxy) -> Iterator[Store]:
    pool = open_pool(proxy.conninfo, concurrency=2, application_name="jobrun-worker")
    try:
        yield Store(pool, call_timeout=SLOW, commit_timeout=SLOW)
    finally:
        pool.close(timeout=1)


def test_a_completion_stuck_on_a_half_open_connection_is_given_up_within_the_lease(
    proxy: TcpProxy, proxied: Store, store: Store, registry: Registry
) -> None:
    go = threading.Event()
    started = threading.Event()

    def handler(ctx: JobContext, job: Job) -> None:
        started.set()
        go.wait(30)
        return None

    registry.register("t", handler)
    job = store.enqueue(NewJob(type="t", backoff=NO_WAIT))
    worker = Worker(
        proxied,
        registry,
        WorkerConfig(
            lease_ttl=dt.timedelta(seconds=LEASE),
            heartbeat_interval=dt.timedelta(milliseconds=500),
            poll_interval=dt.timedelta(milliseconds=200),
            complete_flush_interval=dt.timedelta(milliseconds=1),
        ),
    )
    worker.start()
    try:
        assert started.wait(30)
        claimed = time.monotonic()
        # Half-open: nothing passes on any open connection, new ones hang.
        proxy.hold_new()
        proxy.blackhole()
        go.set()
        wait_for(lambda: worker.stats["lease_lost"] >= 1, timeout=25)
        gave_up = time.monotonic() - claimed
        # Within about the lease (claimed at most LEASE ago, heartbeats stuck
        # since), never the store's 30 s bounds.
        assert gave_up < LEASE + 2.0, gave_up
        assert worker.stats["succeeded"] == 0
    finally:
        proxy.hold_new(False)
        proxy.reset_blackholed()  # the stuck claim and heartbeat fail at once
        worker.stop(timeout=2)
    # The lease logic decides: the job is the reaper's (still leased to this
    # worker, or already requeued), never completed by the abandoned call.
    assert store.get(job.id).state in (State.LEASED, State.QUEUED)


def test_drain_sends_no_heartbeats_and_so_never_bounds_a_completion_by_the_lease(
    store: Store, registry: Registry
) -> None:
    """``drain()`` (``jobrun.testing.run_jobs``) runs jobs in the caller's thread
    without heartbeats: a handler slower than the lease still completes (the
    database's fence decides, and no reaper runs in such a test)."""

    def slow(ctx: JobContext, job: Job) -> None:
        time.sleep(0.6)

    registry.register("t", slow)
    job = store.enqueue(NewJob(type="t", backoff=NO_WAIT))
    worker = Worker(
        store,
        registry,
        WorkerConfig(
            lease_ttl=dt.timedelta(milliseconds=300),
            heartbeat_interval=dt.timedelta(milliseconds=100),
        ),
    )
    assert worker.drain() == 1
    assert store.get(job.id).state is State.SUCCEEDED
