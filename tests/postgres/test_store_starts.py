"""An attempt counts when it starts, not when its job is leased (issue 25).

A claim starts the first ``start`` of its jobs (attempts + 1, started_at);
the others wait for a thread of their worker and are started by
``Store.start_jobs`` just before they run (today's worker starts every job
it claims; this is the store half a buffer of waiting jobs will use). A lease that expires unstarted
(its worker died while the job waited) gives the job back at once with its
attempts unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, State
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, new_job
from tests.postgres.test_store_leases import OWNER, expire

SLOW = Backoff(kind="constant", base=600.0, jitter=0.0)


def test_a_claim_starts_only_its_first_jobs_and_counts_only_their_attempts(
    store: Store,
) -> None:
    store.enqueue_batch([new_job(priority=p) for p in range(4)])
    claimed = store.claim(OWNER, ["default"], 4, TTL, start=1)
    assert [j.priority for j in claimed] == [0, 1, 2, 3]  # claim order
    assert [j.attempts for j in claimed] == [1, 0, 0, 0]
    assert [j.started for j in claimed] == [True, False, False, False]
    assert claimed[0].started_at is not None and claimed[0].started_at <= store.now()
    assert all(store.get(j.id).state is State.LEASED for j in claimed)
    events = [store.events(j.id)[-1] for j in claimed]
    assert [(e.kind, e.attempt, e.detail) for e in events] == [
        ("claimed", 1, None),
        *[("claimed", 0, {"started": False})] * 3,
    ]


def test_a_claim_without_start_starts_every_job_as_before(store: Store) -> None:
    store.enqueue_batch([new_job() for _ in range(3)])
    claimed = store.claim(OWNER, ["default"], 3, TTL)
    assert [(j.attempts, j.started) for j in claimed] == [(1, True)] * 3


def test_an_unstarted_lease_that_expires_is_requeued_now_without_burning_an_attempt(
    store: Store, conn: Any
) -> None:
    store.enqueue(new_job(max_attempts=1, backoff=SLOW))
    [job] = store.claim(OWNER, ["default"], 1, TTL, start=0)
    expire(conn, job.id)
    now = store.now()
    result = store.reap_expired(now, 10)
    assert result.requeued == [job.id] and not result.dead
    after = store.get(job.id)
    assert (after.state, after.attempts, after.run_at) == (State.QUEUED, 0, now)
    assert after.last_error is None  # nothing failed
    reaped = store.events(job.id)[-1]
    assert (reaped.kind, reaped.attempt) == ("reaped", 0)
    assert reaped.detail == {"verdict": "queued", "owner": OWNER, "started": False}
    # Its one attempt is still there: it runs, and succeeds.
    [again] = store.claim(OWNER, ["default"], 1, TTL)
    assert again.attempts == 1
    assert store.complete(again).state is State.SUCCEEDED


def test_a_started_lease_that_expires_still_burns_its_attempt(store: Store, conn: Any) -> None:
    store.enqueue(new_job(max_attempts=1))
    [job] = store.claim(OWNER, ["default"], 1, TTL, start=0)
    [started] = store.start_jobs([job])
    assert (started.attempts, started.started) == (1, True)
    expire(conn, job.id)
    assert store.reap_expired(store.now(), 10).dead == [job.id]
    assert store.get(job.id).attempts == 1


def test_start_jobs_counts_each_attempt_once_and_only_for_the_live_claim(
    store: Store, conn: Any
) -> None:
    store.enqueue_batch([new_job(queue=q) for q in "abc"])
    [live] = store.claim(OWNER, ["a"], 1, TTL, start=0)
    [cancelled] = store.claim(OWNER, ["b"], 1, TTL, start=0)
    [expired] = store.claim(OWNER, ["c"], 1, TTL, start=0)
    store.cancel(cancelled.id)
    expire(conn, expired.id)
    assert [j.id for j in store.start_jobs([live, cancelled, expired])] == [live.id]
    # A call retried after its reply was lost: the same answer, counted once.
    [again] = store.start_jobs([live])
    assert (again.attempts, store.get(live.id).attempts) == (1, 1)
    assert {j.id: store.get(j.id).attempts for j in (cancelled, expired)} == {
        cancelled.id: 0,
        expired.id: 0,
    }


def test_start_jobs_refuses_a_stale_claim_after_the_job_was_claimed_again(
    store: Store, conn: Any
) -> None:
    store.enqueue(new_job())
    [stale] = store.claim(OWNER, ["default"], 1, TTL, start=0)
    expire(conn, stale.id)
    store.reap_expired(store.now(), 10)
    [fresh] = store.claim(OWNER, ["default"], 1, TTL, start=0)
    assert store.start_jobs([stale]) == []  # the token fences it
    assert store.get(fresh.id).attempts == 0
    assert [j.lease_token for j in store.start_jobs([fresh])] == [fresh.lease_token]


def test_start_jobs_refuses_another_owners_lease(store: Store) -> None:
    store.enqueue(new_job())
    [job] = store.claim(OWNER, ["default"], 1, TTL, start=0)
    impostor = dataclasses.replace(job, lease_owner="worker-b")
    assert store.start_jobs([impostor]) == []
    assert store.get(job.id).attempts == 0


def test_releasing_an_unstarted_job_keeps_its_attempts(store: Store) -> None:
    store.enqueue(new_job(max_attempts=2))
    first = store.claim(OWNER, ["default"], 1, TTL)[0]
    store.fail(first, "boom", None)  # one real attempt: attempts 1
    [job] = store.claim(OWNER, ["default"], 1, TTL, start=0)
    assert job.attempts == 1
    released = store.release(job, dt.timedelta(0), "worker shutting down")
    assert (released.state, released.attempts) == (State.QUEUED, 1)
    [started] = store.claim(OWNER, ["default"], 1, TTL)
    released = store.release(started, dt.timedelta(0), "no handler")
    assert released.attempts == 1  # the started attempt given back


def test_a_limited_claim_and_complete_and_claim_start_only_their_first_jobs(
    store: Store,
) -> None:
    store.set_queue_limits("default", concurrency=10)
    store.enqueue_batch([new_job(priority=p) for p in range(6)])
    claimed = store.claim(OWNER, ["default"], 2, TTL, start=1)
    assert [(j.priority, j.attempts) for j in claimed] == [(0, 1), (1, 0)]
    _, more = store.complete_and_claim(claimed[:1], queues=["default"], limit=3, ttl=TTL, start=2)
    assert [(j.priority, j.attempts, j.started) for j in more] == [
        (2, 1, True),
        (3, 1, True),
        (4, 0, False),
    ]


def test_start_must_be_between_zero_and_the_limit(store: Store) -> None:
    for bad in (-1, 3, 1.0, "1"):
        with pytest.raises(ValidationError, match=r"^start: "):
            store.claim(OWNER, ["default"], 2, TTL, start=bad)  # type: ignore[arg-type]
