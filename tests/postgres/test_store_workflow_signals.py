"""Signals sent to a workflow id (migration 0019): kept for every job of the
workflow that waits for the name, now or later, each job taking it once;
parked jobs woken in the sending transaction; refused for an unknown id or a
finished workflow; purged with the workflow's last job."""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

import jobrun
from jobrun.job.errors import InvalidState, NotFound
from jobrun.job.model import Backoff, EventKind, Job, State
from jobrun.job.why import Hold
from jobrun.postgres.diagnose import Diagnose
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL

NOW = Backoff(base=0.0, jitter=0.0)
HOUR = 3600.0


def count(conn: psycopg.Connection[Any], table: str) -> int:
    (n,) = conn.execute(f"SELECT count(*) FROM jobrun.{table}").fetchone() or (0,)
    return int(n)


def flow(store: Store, *nodes: str, queue: str = "wf") -> jobrun.EnqueuedWorkflow:
    """A workflow of independent jobs (all queued at once), one per node."""
    wf = jobrun.Workflow("signup")
    for node in nodes:
        wf.add(jobrun.NewJob(type="t", queue=queue, backoff=NOW), name=node)
    return jobrun.Client(store).enqueue_workflow(wf)


def claim(store: Store, n: int, queue: str = "wf") -> list[Job]:
    jobs = store.claim("w1", [queue], n, TTL)
    assert len(jobs) == n
    return sorted(jobs, key=lambda j: j.id)


def test_a_workflow_signal_reaches_every_waiting_job_once_sent_before_or_after_the_wait(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    run = flow(store, "a", "b")
    assert run.id is not None
    early = store.signal(run.id, "go", {"n": 1}, key="one")  # before any wait began
    assert (early.job_id, early.workflow_id, early.sent, early.woke) == (None, run.id, True, False)
    assert early.to == run.id
    a, b = claim(store, 2)
    first = store.await_step(a, "go", "go", HOUR)
    assert first.record is not None and first.record["payload"] == {"n": 1}
    assert first.record["workflow_id"] == str(run.id)
    again = store.await_step(a, "go-again", "go", HOUR)  # a's copy is taken: it waits
    assert again.record is None
    assert store.await_step(b, "go", "go", HOUR).record == first.record  # b's own copy
    dup = store.signal(run.id, "go", {"n": 99}, key="one")
    assert not dup.sent and not dup.woke
    assert count(conn, "workflow_signals") == 1
    deliveries = conn.execute(
        "SELECT job_id, key, step FROM jobrun.workflow_signal_deliveries ORDER BY job_id"
    ).fetchall()
    assert deliveries == [(a.id, "one", "go"), (b.id, "one", "go")]
    delivered = [e.detail for e in store.events(a.id) if e.kind is EventKind.SIGNAL_DELIVERED]
    assert delivered[0]["workflow_id"] == str(run.id)  # type: ignore[index]


def test_a_wait_takes_the_oldest_of_the_job_s_and_its_workflow_s_signals(
    store: Store,
) -> None:
    run = flow(store, "a")
    assert run.id is not None
    (job,) = run
    store.signal(job.id, "n", "job-1")
    store.signal(run.id, "n", "wf-2")
    store.signal(job.id, "n", "job-3")
    (a,) = claim(store, 1)
    got = [store.await_step(a, f"s{i}", "n", HOUR).record for i in range(4)]
    assert [r["payload"] if r else None for r in got] == ["job-1", "wf-2", "job-3", None]


def test_a_workflow_signal_wakes_each_parked_job_waiting_for_its_name_in_its_transaction(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    run = flow(store, "a", "b", "c")
    assert run.id is not None
    a, b, c = claim(store, 3)
    for job, step, signal in ((a, "go", "go"), (b, "go", "go"), (c, "other", "other")):
        store.await_step(job, step, signal, HOUR)
        assert store.park(job, step).run_at > store.now()
    with conn.transaction():
        conn.execute("LISTEN jobrun_jobs")
    sent = store.signal(run.id, "go", True)
    assert sent.sent and sent.woke and set(sent.woken) == {a.id, b.id}
    now = store.now()
    assert store.get(a.id).run_at <= now and store.get(b.id).run_at <= now
    assert store.get(c.id).run_at > now  # it waits for another name
    assert [n.payload for n in conn.notifies(timeout=1, stop_after=1)] == ["wf"]
    sent_events = [e.detail for e in store.events(a.id) if e.kind is EventKind.SIGNAL_SENT]
    assert sent_events == [
        {"name": "go", "key": sent.key, "woke": True, "workflow_id": str(run.id)}
    ]
    woken = claim(store, 2)
    assert {j.id for j in woken} == {a.id, b.id}
    assert all(store.await_step(j, "go", "go", HOUR).record is not None for j in woken)


def test_a_park_finds_a_workflow_signal_already_there_and_is_due_at_once(
    store: Store,
) -> None:
    run = flow(store, "a")
    assert run.id is not None
    (a,) = claim(store, 1)
    store.await_step(a, "go", "go", HOUR)
    store.signal(run.id, "go", 1)  # the job is leased: stored, nothing woken
    parked = store.park(a, "go")
    assert parked.state is State.QUEUED and parked.run_at <= store.now()


def test_an_id_of_neither_a_job_nor_a_workflow_and_a_finished_workflow_are_refused(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(NotFound, match="job or workflow"):
        store.signal(uuid.uuid4(), "go", None)
    run = flow(store, "a", "b")
    assert run.id is not None
    a, b = claim(store, 2)
    store.complete(a)
    assert store.signal(run.id, "go", 1).sent  # b can still wait
    store.complete(b)
    with pytest.raises(InvalidState, match=f"cannot signal workflow {run.id}: it is succeeded"):
        store.signal(run.id, "go", 2)
    assert count(conn, "workflow_signals") == 1


def test_purge_deletes_deliveries_with_their_job_and_signals_with_the_last_job(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    run = flow(store, "a", "b")
    assert run.id is not None
    store.signal(run.id, "go", 1)
    a, b = claim(store, 2)
    store.await_step(a, "go", "go", HOUR)
    store.complete(a)
    time.sleep(0.01)
    assert store.purge(dt.timedelta(0), 100) == 1
    assert (count(conn, "workflow_signals"), count(conn, "workflow_signal_deliveries")) == (1, 0)
    store.await_step(b, "go", "go", HOUR)
    store.complete(b)
    time.sleep(0.01)
    assert store.purge(dt.timedelta(0), 100) == 1
    assert (count(conn, "workflow_signals"), count(conn, "workflow_signal_deliveries")) == (0, 0)


def test_parks_and_a_workflow_signal_racing_never_miss_each_other(store: Store) -> None:
    """Eight jobs of one workflow park in the same wait while the signal is
    sent: each is woken by the signal or finds it at its park, never neither."""
    for _round in range(5):
        run = flow(store, *[f"n{i}" for i in range(8)])
        assert run.id is not None
        jobs = claim(store, 8)
        for job in jobs:
            store.await_step(job, "go", "go", HOUR)
        go = threading.Barrier(len(jobs) + 1)
        errors: list[BaseException] = []

        def park(job: Job, go: threading.Barrier, errors: list[BaseException]) -> None:
            try:
                go.wait()
                store.park(job, "go")
            except BaseException as exc:  # pragma: no cover - shown by the assert below
                errors.append(exc)

        threads = [threading.Thread(target=park, args=(j, go, errors)) for j in jobs]
        for t in threads:
            t.start()
        go.wait()
        store.signal(run.id, "go", _round)
        for t in threads:
            t.join()
        assert errors == []
        now = store.now()
        assert all(store.get(j.id).run_at <= now for j in jobs)
        for job in claim(store, 8):
            record = store.await_step(job, "go", "go", HOUR).record
            assert record is not None and record["payload"] == _round
            store.complete(job)


def test_why_names_a_workflow_job_s_signal_wait_until_the_workflow_signal_wakes_it(
    store: Store,
) -> None:
    run = flow(store, "a")
    assert run.id is not None
    (a,) = claim(store, 1)
    store.await_step(a, "confirm", "email.confirmed", HOUR)
    store.park(a, "confirm")
    scheduled = [r for r in Diagnose(store).why(a.id).reasons if r.hold is Hold.SCHEDULED]
    assert "it waits for signal 'email.confirmed' (step 'confirm')" in scheduled[0].text
    store.signal(run.id, "email.confirmed", None)
    assert not [r for r in Diagnose(store).why(a.id).reasons if r.hold is Hold.SCHEDULED]
