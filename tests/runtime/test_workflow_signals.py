"""Signals sent to a workflow id, received by a real worker's handlers: every
job of the workflow waiting for the name gets its own copy, once, whether it
waits already, parks while the signal is sent, or begins waiting later."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

import jobrun
from jobrun.job.model import Backoff, Job, State
from jobrun.job.signals import SignalTimeout
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry, Worker
from tests.support.waiting import wait_for

NOW = Backoff(kind="constant", base=0.0, jitter=0.0)
HOUR = dt.timedelta(hours=1)


def test_a_workflow_signal_wakes_its_parked_jobs_and_reaches_a_later_wait(
    store: Store,
    registry: Registry,
    conn: psycopg.Connection[Any],
    make_worker: Callable[..., Worker],
) -> None:
    def approve(ctx: JobContext, job: Job) -> Any:
        return ctx.wait_for_signal("approved", timeout=HOUR)

    def other(ctx: JobContext, job: Job) -> Any:
        try:
            return ctx.wait_for_signal("rejected", timeout=0.3)
        except SignalTimeout:
            return "timed out"

    registry.register("approve", approve)
    registry.register("other", other)
    wf = jobrun.Workflow("review")
    first = wf.add(jobrun.NewJob(type="approve", backoff=NOW), name="legal")
    wf.add(jobrun.NewJob(type="approve", backoff=NOW), name="finance")
    wf.add(jobrun.NewJob(type="other", backoff=NOW), name="other")
    # Begins its wait only after "legal" finished, long after the signal.
    wf.add(jobrun.NewJob(type="approve", backoff=NOW), name="archive", after=[first])
    run = jobrun.Client(store).enqueue_workflow(wf)
    assert run.id is not None
    make_worker(concurrency=4, poll_interval=dt.timedelta(milliseconds=100))
    parked = "SELECT count(*) FROM jobrun.jobs AS j JOIN jobrun.job_waits AS w ON w.job_id = j.id"
    parked += " WHERE j.state = 'queued' AND w.signal = 'approved'"
    wait_for(lambda: conn.execute(parked).fetchone() == (2,))
    sent = store.signal(run.id, "approved", {"by": "ada"}, key="click")
    assert sent.sent and set(sent.woken) == {run["legal"].id, run["finance"].id}
    assert not store.signal(run.id, "approved", {"by": "bob"}, key="click").sent
    wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in run), timeout=20)
    results = {node: store.get(job.id).result for node, job in run.jobs.items()}
    assert results == {
        "legal": {"by": "ada"},
        "finance": {"by": "ada"},
        "other": "timed out",
        "archive": {"by": "ada"},
    }
    delivered = "SELECT count(*) FROM jobrun.workflow_signal_deliveries"
    assert conn.execute(delivered).fetchone() == (3,)


def test_workflow_signals_racing_their_jobs_waits_are_delivered_once_to_each(
    store: Store,
    registry: Registry,
    make_store: Callable[..., Store],
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    # 12 workflows of two jobs waiting for the same name; each workflow's
    # signal is sent at a moment of its jobs' first run (before the waits,
    # while they look, while they park, once parked): a missed one would
    # leave a job parked for the hour of its timeout, a double delivery would
    # show in the deliveries.
    def handler(ctx: JobContext, job: Job) -> Any:
        return ctx.wait_for_signal("go", timeout=HOUR)

    registry.register("race", handler)
    runs = []
    for n in range(12):
        wf = jobrun.Workflow(f"race-{n}")
        wf.add(jobrun.NewJob(type="race", backoff=NOW), name="a")
        wf.add(jobrun.NewJob(type="race", backoff=NOW), name="b")
        runs.append(jobrun.Client(store).enqueue_workflow(wf))
    sender = make_store()

    def send() -> None:
        for n, run in enumerate(runs):
            time.sleep(0.004 * (n % 5))
            assert run.id is not None
            sender.signal(run.id, "go", n)

    thread = threading.Thread(target=send)
    make_worker(concurrency=8)
    thread.start()
    thread.join(30)
    jobs = [job for run in runs for job in run]
    wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in jobs), timeout=20)
    assert [[store.get(j.id).result for j in run] for run in runs] == [[n, n] for n in range(12)]
    delivered = "SELECT count(*) FROM jobrun.workflow_signal_deliveries"
    assert conn.execute(delivered).fetchone() == (24,)
