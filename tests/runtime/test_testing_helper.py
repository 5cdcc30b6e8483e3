"""jobrun.testing.run_jobs: a registry's jobs run to completion, synchronously."""

from __future__ import annotations

from typing import Any

from jobrun import Client
from jobrun.job.model import Backoff, Job, State
from jobrun.postgres.store import Store
from jobrun.testing import run_jobs
from jobrun.worker import JobContext, PermanentFailure, Registry


def test_run_jobs_runs_every_runnable_job_through_the_worker_path(store: Store, conn: Any) -> None:
    conn.execute("CREATE TABLE side (job_id uuid)")
    registry = Registry()
    registry.register("ok", lambda ctx, job: None)
    registry.register(
        "tx", lambda ctx, job: lambda c: c.execute("INSERT INTO side VALUES (%s)", [job.id])
    )

    def bad(ctx: JobContext, job: Job) -> None:
        raise PermanentFailure("no")

    registry.register("bad", bad)
    client = Client(store)
    ok = client.enqueue("ok")
    tx = client.enqueue("tx")
    dead = client.enqueue("bad")
    later = client.enqueue("flaky.unknown", backoff=Backoff(kind="constant", base=600.0, jitter=0))
    report = run_jobs(client, registry)
    assert report.ran == 4
    assert (report.succeeded, report.failed) == (2, 1)  # the unknown type is released
    assert client.get(ok.id).state is State.SUCCEEDED
    assert client.get(tx.id).state is State.SUCCEEDED
    assert client.get(dead.id).state is State.DEAD
    released = client.get(later.id)  # no handler: given back for later, attempt not counted
    assert (released.state, released.attempts) == (State.QUEUED, 0)
    assert conn.execute("SELECT job_id FROM side").fetchall() == [(tx.id,)]


def test_run_jobs_only_touches_its_queues(store: Store) -> None:
    registry = Registry()
    registry.register("ok", lambda ctx, job: None)
    client = Client(store)
    other = client.enqueue("ok", queue="other")
    assert run_jobs(store, registry, queues=["default"]).ran == 0
    assert run_jobs(store, registry, queues=["other"]).ran == 1
    assert client.get(other.id).state is State.SUCCEEDED
