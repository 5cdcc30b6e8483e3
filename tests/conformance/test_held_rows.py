"""Who holds a runnable job's row wakes its queue when it lets go.

A claim passes by a row another transaction holds (``FOR UPDATE SKIP
LOCKED``) and, finding nothing, its worker waits for a wake-up or its next
poll. So every statement that locks a queued, due job without claiming it
(a client's ``wait`` marking it watched, an enqueue naming it as a parent,
a signal to it) also wakes its queue at COMMIT; otherwise a runnable job
waits a whole poll interval for a claim that passed it by (it did, in the
runtime suite: a ``wait`` on a child that its parent's completion had just
released).
"""

from __future__ import annotations

from collections.abc import Callable

import jobrun
from jobrun.job.model import State
from jobrun.postgres.store import Store
from tests.conformance.conftest import TTL, Listener
from tests.conformance.drive import Caller, Driven
from tests.postgres.conftest import new_job


def test_a_claim_that_passed_by_a_parent_held_by_an_enqueue_is_woken_by_its_commit(
    client: Driven,
    worker_store: Store,
    caller: Callable[..., Caller],
    listen: Callable[..., Listener],
) -> None:
    parent = worker_store.enqueue(new_job())
    listener = listen()
    c = caller()
    child = client.enqueue("child", conn=c, after=[parent.id])
    assert worker_store.claim("w", ["default"], 10, TTL) == []  # passed by: held
    assert listener.payloads() == []
    c.commit()
    assert listener.payloads() == ["default"]
    (claimed,) = worker_store.claim("w", ["default"], 10, TTL)
    assert claimed.id == parent.id
    assert client.get(child.id).state is State.WAITING


def test_an_enqueue_after_a_parent_not_runnable_wakes_no_one(
    client: Driven,
    worker_store: Store,
    listen: Callable[..., Listener],
) -> None:
    leased = worker_store.enqueue(new_job())
    worker_store.claim("w", ["default"], 10, TTL)
    later = worker_store.enqueue(new_job(delay=TTL))
    listener = listen()
    client.enqueue("child", after=[leased.id, later.id])
    assert listener.payloads() == []


def test_a_watch_of_a_runnable_job_wakes_its_queue_and_of_any_other_none(
    store: Driven,
    worker_store: Store,
    listen: Callable[..., Listener],
) -> None:
    runnable = worker_store.enqueue(new_job(queue="q"))
    later = worker_store.enqueue(new_job(queue="later", delay=TTL))
    leased = worker_store.enqueue(new_job(queue="leased"))
    worker_store.claim("w", ["leased"], 1, TTL)
    listener = listen()
    for job in (later, leased):
        assert store.watch(job.id).id == job.id
    assert listener.payloads() == []
    assert store.watch(runnable.id).state is State.QUEUED
    assert listener.payloads() == ["q"]


def test_a_signal_to_a_queued_job_wakes_its_queue(
    client: Driven,
    worker_store: Store,
    listen: Callable[..., Listener],
) -> None:
    job = worker_store.enqueue(new_job(queue="q"))
    listener = listen()
    sent = client.signal(job.id, "early", {"ok": True}, key="k")
    assert sent.sent and not sent.woke  # stored for a wait not begun yet
    assert listener.payloads() == ["q"]


def test_cancelling_a_workflow_wakes_the_queue_of_a_queued_parent_outside_it(
    client: Driven,
    worker_store: Store,
    listen: Callable[..., Listener],
) -> None:
    parent = worker_store.enqueue(new_job(queue="outside"))
    flow = jobrun.Workflow("held")
    flow.add(jobrun.NewJob(type="child"), after=[parent.id])
    enqueued = client.enqueue_workflow(flow)
    listener = listen()
    assert client.cancel_workflow(enqueued.id).cancelled == 1
    assert listener.payloads() == ["outside"]
    assert client.get(parent.id).state is State.QUEUED


def test_retrying_a_workflow_wakes_the_queues_of_the_queued_jobs_it_held(
    client: Driven,
    worker_store: Store,
    listen: Callable[..., Listener],
) -> None:
    flow = jobrun.Workflow("held")
    flow.add(jobrun.NewJob(type="lost", queue="lost"))
    flow.add(jobrun.NewJob(type="still", queue="still"))
    enqueued = client.enqueue_workflow(flow)
    (claimed,) = worker_store.claim("w", ["lost"], 1, TTL)
    worker_store.fail(claimed, "boom", None, permanent=True)
    listener = listen()
    assert client.retry_workflow(enqueued.id).queued == 1
    assert sorted(listener.payloads()) == ["lost", "still"]
