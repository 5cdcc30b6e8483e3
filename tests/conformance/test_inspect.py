"""Inspect and administer jobs, on either store: get, list, events, cancel, retry, watch, wait.

The worker's side (claims, completions) is the sync Store's alone
(``worker_store``); what a client sees of it must not depend on its flavour.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobrun.job.errors import InvalidState, NotFound, WaitTimeout
from jobrun.job.model import Job, State
from jobrun.postgres.store import Store
from tests.conformance.conftest import TTL, Listener
from tests.conformance.drive import Driven
from tests.postgres.conftest import new_job

OWNER = "worker-a"


def claim_one(worker: Store, queue: str = "default") -> Job:
    (job,) = worker.claim(OWNER, [queue], 1, TTL)
    return job


@pytest.fixture
def later() -> Iterator[Callable[[float, Callable[[], Any]], None]]:
    """``later(seconds, fn)``: run ``fn`` on a thread after ``seconds`` (joined after the test)."""
    threads: list[threading.Thread] = []

    def schedule(seconds: float, fn: Callable[[], Any]) -> None:
        def run() -> None:
            time.sleep(seconds)
            fn()

        threads.append(threading.Thread(target=run))
        threads[-1].start()

    yield schedule
    for t in threads:
        t.join(30)


# -- get, list, events -------------------------------------------------------------------


def test_get_returns_the_job_and_an_unknown_id_is_not_found(store: Driven) -> None:
    job = store.enqueue(new_job())
    assert store.get(job.id) == job
    with pytest.raises(NotFound) as info:
        store.get(uuid.uuid4())
    assert info.value.what == "job"


def test_list_filters_by_queue_state_and_type_oldest_first_in_keyset_pages(store: Driven) -> None:
    ids = [store.enqueue(new_job(queue="a", type="t.one")).id for _ in range(5)]
    other_queue = store.enqueue(new_job(queue="b", type="t.one")).id
    other_type = store.enqueue(new_job(queue="a", type="t.two")).id
    store.cancel(ids[4])
    page1 = store.list(queue="a", type="t.one", state=State.QUEUED, limit=2)
    page2 = store.list(queue="a", type="t.one", state="queued", limit=2, after=page1[-1].id)
    page3 = store.list(queue="a", type="t.one", state=State.QUEUED, limit=2, after=page2[-1].id)
    assert [j.id for j in page1 + page2] == ids[:4]
    assert page3 == []
    assert [j.id for j in store.list()] == [*ids, other_queue, other_type]
    assert [j.id for j in store.list(state="cancelled")] == [ids[4]]
    assert store.list(state=State.DEAD) == []


def test_events_tell_the_story_of_a_job_oldest_first(store: Driven, worker_store: Store) -> None:
    store.enqueue(new_job(max_attempts=2))
    job = claim_one(worker_store)
    worker_store.fail(job, "first", None)
    job = claim_one(worker_store)
    worker_store.complete(job)
    events = store.events(job.id)
    assert [str(e.kind) for e in events] == [
        "enqueued",
        "claimed",
        "retrying",
        "claimed",
        "succeeded",
    ]
    assert [e.attempt for e in events] == [0, 1, 1, 2, 2]
    assert events[2].detail == {"via": "fail", "error": "first", "permanent": False}
    assert all(e.at.tzinfo is dt.UTC for e in events)
    assert store.events(uuid.uuid4()) == []


# -- cancel ------------------------------------------------------------------------------


def test_cancel_ends_a_queued_job_at_once(store: Driven) -> None:
    job = store.enqueue(new_job())
    done = store.cancel(job.id)
    assert done.state is State.CANCELLED and done.finished_at is not None
    assert done == store.get(job.id)
    assert [e.kind for e in store.events(job.id)] == ["enqueued", "cancelled"]
    assert store.cancel(job.id) == done  # terminal: unchanged


def test_cancel_of_a_leased_job_asks_its_worker_to_stop_once(
    store: Driven, worker_store: Store
) -> None:
    store.enqueue(new_job())
    job = claim_one(worker_store)
    asked = store.cancel(job.id)
    assert asked.state is State.LEASED and asked.cancel_requested
    store.cancel(job.id)
    assert [e.kind for e in store.events(job.id)] == ["enqueued", "claimed", "cancel_requested"]
    worker_store.complete(job)
    assert store.get(job.id).state is State.CANCELLED  # the cancel wins


def test_cancel_of_a_finished_job_returns_it_unchanged_and_of_an_unknown_one_is_not_found(
    store: Driven, worker_store: Store
) -> None:
    store.enqueue(new_job())
    done = worker_store.complete(claim_one(worker_store))
    assert store.cancel(done.id) == done
    with pytest.raises(NotFound):
        store.cancel(uuid.uuid4())


# -- retry -------------------------------------------------------------------------------


@pytest.mark.parametrize("end", ["dead", "cancelled", "succeeded"])
def test_retry_queues_a_finished_job_now_with_its_attempts_reset_and_wakes_its_queue(
    store: Driven, worker_store: Store, listen: Callable[..., Listener], end: str
) -> None:
    store.enqueue(new_job(max_attempts=1, queue="q"))
    job = claim_one(worker_store, "q")
    if end == "dead":
        worker_store.fail(job, "boom", None)
    elif end == "cancelled":
        store.cancel(job.id)
        worker_store.complete(job)
    else:
        worker_store.complete(job)
    assert store.get(job.id).state == end
    listener = listen()
    retried = store.retry(job.id)
    assert listener.payloads() == ["q"]
    assert retried == store.get(job.id)
    assert (retried.state, retried.attempts) == (State.QUEUED, 0)
    assert retried.finished_at is None and not retried.cancel_requested
    assert retried.run_at == retried.updated_at
    assert store.events(job.id)[-1].kind == "retried"
    assert claim_one(worker_store, "q").attempts == 1


def test_retry_of_a_queued_job_makes_it_runnable_now(store: Driven, worker_store: Store) -> None:
    job = store.enqueue(new_job(delay=dt.timedelta(hours=1)))
    retried = store.retry(job.id)
    assert retried.run_at <= store.now()
    assert claim_one(worker_store).id == job.id


def test_retry_of_a_leased_job_is_invalid_state_and_of_an_unknown_one_not_found(
    store: Driven, worker_store: Store
) -> None:
    store.enqueue(new_job())
    job = claim_one(worker_store)
    with pytest.raises(InvalidState) as info:
        store.retry(job.id)
    assert (info.value.state, info.value.job_id) == ("leased", job.id)
    with pytest.raises(NotFound):
        store.retry(uuid.uuid4())


# -- watch and wait ------------------------------------------------------------------------


def test_a_watched_job_announces_its_end_on_the_finish_channel(
    store: Driven, worker_store: Store, listen: Callable[..., Listener]
) -> None:
    finished = listen("jobrun_jobs_done")
    watched = store.enqueue(new_job())
    unwatched = store.enqueue(new_job())
    assert store.watch(watched.id) == store.get(watched.id)
    store.cancel(unwatched.id)
    store.cancel(watched.id)
    assert finished.payloads() == [str(watched.id)]
    with pytest.raises(NotFound):
        store.watch(uuid.uuid4())


def test_wait_returns_the_job_once_a_worker_finished_it_woken_by_the_notification(
    store: Driven, worker_store: Store, later: Callable[[float, Callable[[], Any]], None]
) -> None:
    job = store.enqueue(new_job())
    claimed = claim_one(worker_store)
    later(0.3, lambda: worker_store.complete(claimed, result={"sum": 5}))
    started = time.monotonic()
    done = store.wait(job.id, timeout=30, poll_interval=60)  # only a notification wakes it
    assert time.monotonic() - started < 20
    assert (done.state, done.result) == (State.SUCCEEDED, {"sum": 5})
    assert store.wait(job.id, timeout=0) == done  # finished: answered at once


def test_wait_sees_a_cancel_and_a_dead_end_too(
    store: Driven, worker_store: Store, later: Callable[[float, Callable[[], Any]], None]
) -> None:
    queued = store.enqueue(new_job(queue="a"))
    later(0.3, lambda: store.cancel(queued.id))
    assert store.wait(queued.id, timeout=30, poll_interval=60).state is State.CANCELLED
    store.enqueue(new_job(queue="b", max_attempts=1))
    claimed = claim_one(worker_store, "b")
    later(0.3, lambda: worker_store.fail(claimed, "boom", None))
    dead = store.wait(claimed.id, timeout=30, poll_interval=60)
    assert (dead.state, dead.last_error) == (State.DEAD, "boom")


def test_wait_times_out_with_the_job_as_it_stood(store: Driven) -> None:
    job = store.enqueue(new_job())
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        store.wait(job.id, timeout=0.5, poll_interval=0.1)
    assert 0.4 < time.monotonic() - started < 10
    assert isinstance(info.value, TimeoutError)
    assert info.value.job == store.get(job.id)
    with pytest.raises(NotFound):
        store.wait(uuid.uuid4(), timeout=1)
