"""A Worker in the registry: registered at start with its types, kept fresh
by its idle heartbeat, removed at a clean stop; two workers on one queue each
run the types they know (in this process; the same across processes in
tests/acceptance/test_workers_registry.py)."""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from jobrun.job.model import Job, NewJob, State
from jobrun.postgres.store import Store
from jobrun.worker import Registry, Worker, WorkerConfig
from jobrun.worker.context import JobContext
from tests.runtime.conftest import FAST
from tests.support.waiting import wait_for


def test_a_worker_registers_at_start_stays_fresh_while_idle_and_leaves_at_stop(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    registry.handler("b.type")(lambda ctx, job: None)
    registry.handler("a.type")(lambda ctx, job: None)
    worker = make_worker(queues={"q1": None, "q2": None}, concurrency=3)
    [row] = store.workers()
    assert row.info.id == worker.owner and row.info.types == ("a.type", "b.type")
    assert row.info.queues == ("q1", "q2") and row.info.concurrency == 3
    assert row.info.pid == os.getpid() and row.info.host == socket.gethostname()[:255]
    assert row.info.lease_ttl == FAST["lease_ttl"]
    conn.execute("UPDATE jobrun.workers SET last_seen_at = now() - interval '1 hour'")
    wait_for(lambda: store.workers()[0].live)  # the idle heartbeat registered it again
    assert worker.stop(timeout=5)
    assert store.workers() == []


def test_two_workers_on_one_queue_each_run_the_types_they_know(store: Store, dsn: str) -> None:
    ran: dict[str, list[str]] = {"a": [], "b": []}
    lock = threading.Lock()

    def recorder(name: str) -> Callable[[JobContext, Job], None]:
        def handle(ctx: JobContext, job: Job) -> None:
            with lock:
                ran[name].append(job.type)

        return handle

    workers = []
    for name in ("a", "b"):
        registry = Registry()
        registry.handler(f"kind.{name}")(recorder(name))
        w = Worker(store, registry, WorkerConfig(**FAST))
        w.start()
        workers.append(w)
    try:
        jobs = [store.enqueue(NewJob(type=f"kind.{k}")) for _ in range(5) for k in "ab"]
        wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in jobs))
    finally:
        for w in workers:
            w.stop(timeout=5)
    assert ran == {"a": ["kind.a"] * 5, "b": ["kind.b"] * 5}
    assert all(store.get(j.id).releases == 0 for j in jobs)
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM jobrun.workers").fetchone() == (0,)


def test_an_unregistered_drain_runs_every_type_it_knows_and_releases_the_rest(
    store: Store, registry: Registry
) -> None:
    # run_jobs' path: a worker never started is not registered, claims every type.
    registry.handler("known")(lambda ctx, job: None)
    known = store.enqueue(NewJob(type="known"))
    unknown = store.enqueue(NewJob(type="unknown"))
    worker = Worker(store, registry, WorkerConfig(**FAST))
    assert worker.drain() == 2
    assert store.get(known.id).state is State.SUCCEEDED
    assert store.get(unknown.id).releases == 1
    assert dt.timedelta(0) < store.get(unknown.id).run_at - store.now()
