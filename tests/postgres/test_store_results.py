"""Results, releases and waiting: a handler's return value, an attempt given back,
and a client woken when a job ends."""

from __future__ import annotations

import datetime as dt
import decimal
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from jobrun.job import validate
from jobrun.job.errors import LeaseLost, ValidationError, WaitTimeout
from jobrun.job.model import Backoff, State
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, counts, new_job
from tests.postgres.test_store_leases import OWNER, claim_one, event_kinds, expire

RESULTS = [
    pytest.param({"sent": 3, "ids": [1, 2]}, id="object"),
    pytest.param([1, "two", None], id="array"),
    pytest.param("done", id="string"),
    pytest.param(42, id="int"),
    pytest.param(2.5, id="float"),
    pytest.param(True, id="bool"),
]


@pytest.mark.parametrize("result", RESULTS)
def test_complete_stores_the_handlers_result_with_the_success(store: Store, result: Any) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    done = store.complete(job, result=result)
    assert done.result == result
    assert store.get(job.id).result == result


def test_the_transactional_path_stores_the_result_with_the_callables_writes(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("CREATE TABLE side (x int)")
    store.enqueue(new_job())
    job = claim_one(store)
    store.complete(job, lambda c: c.execute("INSERT INTO side VALUES (1)"), result={"ok": 1})
    assert store.get(job.id).result == {"ok": 1}


def test_a_failing_commit_callable_stores_no_result(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)

    def boom(c: psycopg.Connection[Any]) -> None:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        store.complete(job, boom, result={"ok": 1})
    stored = store.get(job.id)
    assert stored.state is State.LEASED and stored.result is None


def test_complete_many_and_complete_many_tx_store_each_jobs_result(store: Store) -> None:
    store.enqueue_batch([new_job() for _ in range(4)])
    a, b, c, d = store.claim(OWNER, ["default"], 4, TTL)
    store.complete_many([a, b], results={a.id: {"n": 1}})
    store.complete_many_tx([(c, lambda conn: None), (d, None)], results={c.id: [3], d.id: "four"})
    assert [store.get(j.id).result for j in (a, b, c, d)] == [{"n": 1}, None, [3], "four"]


def test_a_result_checked_on_the_handlers_thread_is_stored_and_returned_as_its_value(
    store: Store,
) -> None:
    store.enqueue_batch([new_job() for _ in range(3)])
    a, b, c = store.claim(OWNER, ["default"], 3, TTL)
    done = store.complete(a, lambda conn: None, result=validate.checked_result({"n": 1}))
    assert done.result == {"n": 1}
    store.complete_many([b], results={b.id: validate.checked_result([2])})
    store.complete_many_tx([(c, None)], results={c.id: validate.checked_result("three")})
    assert [store.get(j.id).result for j in (a, b, c)] == [{"n": 1}, [2], "three"]


def test_a_cancelled_job_keeps_no_result(store: Store) -> None:
    store.enqueue_batch([new_job(), new_job()])
    one, two = store.claim(OWNER, ["default"], 2, TTL)
    store.cancel(one.id)
    store.cancel(two.id)
    assert store.complete(one, result={"x": 1}).state is State.CANCELLED
    store.complete_many([two], results={two.id: {"x": 1}})
    assert store.get(one.id).result is None and store.get(two.id).result is None


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(decimal.Decimal("1.5"), id="decimal"),
        pytest.param(float("nan"), id="nan"),
        pytest.param({1: "x"}, id="int-key"),
        pytest.param("\ud800", id="surrogate"),
        pytest.param("x" * (1024 * 1024 + 1), id="too-big"),
        pytest.param({1, 2}, id="set"),
    ],
)
def test_a_result_jsonb_cannot_hold_is_a_validation_error_before_any_sql(
    store: Store, conn: psycopg.Connection[Any], bad: Any
) -> None:
    store.enqueue_batch([new_job(), new_job()])
    one, two = store.claim(OWNER, ["default"], 2, TTL)
    before = counts(conn)
    with pytest.raises(ValidationError, match=r"^result: "):
        store.complete(one, result=bad)
    with pytest.raises(ValidationError, match=r"^result: "):
        store.complete_many([one, two], results={two.id: bad})
    with pytest.raises(ValidationError, match=r"^result: "):
        store.complete_many_tx([(one, None)], results={one.id: bad})
    assert counts(conn) == before
    assert store.get(one.id).state is State.LEASED


def test_retry_forgets_the_result(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    store.complete(job, result=1)
    assert store.retry(job.id).result is None


# -- release: an attempt given back ------------------------------------------------


def test_release_queues_the_job_again_later_and_gives_its_attempt_back(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    assert job.attempts == 1
    now = store.now()
    released = store.release(job, dt.timedelta(minutes=2), "no handler for test.job")
    assert (released.state, released.attempts) == (State.QUEUED, 0)
    assert released.run_at >= now + dt.timedelta(minutes=2)
    assert released.last_error == "no handler for test.job"
    assert released.lease_token is None
    assert event_kinds(store, job.id)[-1] == "released"
    assert store.claim(OWNER, ["default"], 1, TTL) == []


def test_a_released_job_never_runs_out_of_attempts(store: Store) -> None:
    store.enqueue(new_job(max_attempts=1))
    for _ in range(5):
        job = claim_one(store)
        store.release(job, dt.timedelta(0), "not yet")
    assert store.get(job.id).state is State.QUEUED


def test_release_by_a_stale_claim_is_lease_lost(store: Store, conn: Any) -> None:
    store.enqueue(new_job(backoff=Backoff(base=0.0, jitter=0.0)))
    stale = claim_one(store)
    expire(conn, stale.id)
    store.reap_expired(store.now(), 10)
    claim_one(store)
    with pytest.raises(LeaseLost):
        store.release(stale, dt.timedelta(0), "x")


def test_releasing_a_job_whose_cancel_was_requested_cancels_it(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    store.cancel(job.id)
    assert store.release(job, dt.timedelta(0), "x").state is State.CANCELLED


# -- wait: woken when the job ends ------------------------------------------------------


def _later(seconds: float, fn: Any) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        fn()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


FINISHERS = {
    "complete": lambda s, j: s.complete(j, result={"ok": True}),
    "complete_many": lambda s, j: s.complete_many([j], results={j.id: {"ok": True}}),
    "complete_many_tx": lambda s, j: s.complete_many_tx([(j, None)], results={j.id: {"ok": True}}),
    "fail": lambda s, j: s.fail(j, "boom", None, permanent=True),
    "release-cancelled": lambda s, j: (s.cancel(j.id), s.release(j, dt.timedelta(0), "x")),
}


@pytest.mark.parametrize("finish", list(FINISHERS))
def test_wait_is_woken_by_the_transition_that_ends_the_job(store: Store, finish: str) -> None:
    """Woken by the notification: long before the 60 s poll that would find it otherwise."""
    store.enqueue(new_job())
    job = claim_one(store)
    _later(0.5, lambda: FINISHERS[finish](store, job))
    started = time.monotonic()
    done = store.wait(job.id, timeout=30, poll_interval=60)
    assert time.monotonic() - started < 30
    assert done.state.terminal
    if finish.startswith("complete"):
        assert done.result == {"ok": True}


def test_wait_is_woken_when_the_reaper_or_a_cancel_ends_the_job(store: Store, conn: Any) -> None:
    store.enqueue_batch([new_job(max_attempts=1), new_job()])
    leased = claim_one(store)
    queued = store.list(state="queued")[0]
    expire(conn, leased.id)
    _later(0.5, lambda: store.reap_expired(store.now(), 10))
    assert store.wait(leased.id, timeout=30, poll_interval=60).state is State.DEAD
    _later(0.5, lambda: store.cancel(queued.id))
    assert store.wait(queued.id, timeout=30, poll_interval=60).state is State.CANCELLED


def test_wait_for_a_finished_job_answers_at_once(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    store.complete(job, result=7)
    assert store.wait(job.id, timeout=0).result == 7


def test_wait_that_runs_out_is_a_wait_timeout_carrying_the_job(store: Store) -> None:
    job = store.enqueue(new_job())
    with pytest.raises(WaitTimeout) as caught:
        store.wait(job.id, timeout=0.3)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.job.id == job.id and caught.value.job.state is State.QUEUED


def test_wait_finds_the_end_by_polling_when_no_notification_comes(store: Store, conn: Any) -> None:
    job = store.enqueue(new_job())
    # Ended behind jobrun's back: no notification is ever sent.
    _later(
        0.3,
        lambda: conn.execute(
            "UPDATE jobrun.jobs SET state = 'cancelled', finished_at = now() WHERE id = %s",
            [job.id],
        ),
    )
    assert store.wait(job.id, timeout=30, poll_interval=0.2).state is State.CANCELLED


def test_only_watched_jobs_are_announced_on_the_finish_channel(store: Store, dsn: str) -> None:
    store.enqueue_batch([new_job(), new_job()])
    watched, other = store.claim(OWNER, ["default"], 2, TTL)
    store.watch(watched.id)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {store.finish_channel}")
        store.complete_many([watched, other])
        payloads = [n.payload for n in listener.notifies(timeout=0.5)]
    assert payloads == [str(watched.id)]


def test_wait_for_a_job_that_does_not_exist_is_not_found(store: Store) -> None:
    from jobrun.job.errors import NotFound  # noqa: PLC0415

    with pytest.raises(NotFound):
        store.wait(uuid.uuid4(), timeout=1)
