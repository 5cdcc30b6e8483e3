"""The store's durable waits and signals (migration 0017): fenced by the claim,
parked and woken in transactions that cannot miss each other, purged with
their job."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import LeaseLost, ValidationError
from jobrun.job.model import Backoff, EventKind, Job, State
from jobrun.postgres.events import EventMode
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, new_job

NOW = Backoff(base=0.0, jitter=0.0)
HOUR = 3600.0


def claim_one(store: Store, owner: str = "w1") -> Job:
    (job,) = store.claim(owner, ["default"], 1, TTL)
    return job


def count(conn: psycopg.Connection[Any], table: str) -> int:
    (n,) = conn.execute(f"SELECT count(*) FROM jobrun.{table}").fetchone() or (0,)
    return int(n)


def test_a_stale_claim_can_neither_begin_a_wait_nor_park_the_job(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(backoff=NOW))
    stale = claim_one(store)
    conn.execute(
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s",
        [stale.id],
    )
    assert store.reap_expired(store.now(), 10).requeued == [stale.id]
    fresh = claim_one(store)  # the same owner again: only the token tells them apart
    with pytest.raises(LeaseLost):
        store.await_step(stale, "nap", None, HOUR)
    assert count(conn, "job_waits") == 0
    turn = store.await_step(fresh, "nap", None, HOUR)
    assert turn.record is None and turn.until is not None
    with pytest.raises(LeaseLost):
        store.park(stale, "nap")
    parked = store.park(fresh, "nap")
    assert parked.state is State.QUEUED and parked.run_at == turn.until
    assert parked.lease_owner is None and parked.lease_token is None


def test_a_wait_s_deadline_is_set_by_its_first_turn_and_never_moved(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(backoff=NOW))
    job = claim_one(store)
    first = store.await_step(job, "confirm", "confirmed", HOUR)
    assert first.until is not None and first.until - first.now == dt.timedelta(hours=1)
    again = store.await_step(job, "confirm", "confirmed", 5.0)  # a later turn asks less
    assert again.until == first.until and again.record is None
    conn.execute("UPDATE jobrun.job_waits SET until = now() - interval '1 second'")
    over = store.await_step(job, "confirm", "confirmed", HOUR)
    assert over.record == {
        "signal": "confirmed",
        "key": None,
        "payload": None,
        "timed_out": True,
        "until": over.record["until"] if over.record else None,
    }
    assert count(conn, "job_waits") == 0
    assert conn.execute("SELECT name FROM jobrun.job_steps").fetchall() == [("confirm",)]


def test_a_park_with_a_signal_already_there_is_due_now_and_a_cancel_wins(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(backoff=NOW))
    job = claim_one(store)
    store.await_step(job, "go", "go", HOUR)
    store.signal(job.id, "go", 1)  # stored for the wait: the job is leased, nothing woken
    parked = store.park(job, "go")
    assert parked.state is State.QUEUED and parked.run_at <= store.now()
    waiting = [e for e in store.events(job.id) if e.kind is EventKind.PARKED]
    assert waiting[-1].detail["ready"] is True  # type: ignore[index]

    store.enqueue(new_job(backoff=NOW, idempotency_key="second"))
    second = [j for j in store.claim("w1", ["default"], 2, TTL) if j.id != job.id]
    assert len(second) == 1
    store.await_step(second[0], "nap", None, HOUR)
    store.cancel(second[0].id)
    assert store.park(second[0], "nap").state is State.CANCELLED


def test_a_signal_wakes_only_a_job_parked_waiting_for_its_name(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(backoff=NOW))
    job = claim_one(store)
    store.await_step(job, "nap", None, HOUR)
    asleep = store.park(job, "nap")
    other = store.signal(job.id, "confirmed", "too early")
    assert other.sent and not other.woke  # a sleep is woken by no signal
    assert store.get(job.id).run_at == asleep.run_at
    job = claim_one_at(store, conn, job)
    conn.execute("UPDATE jobrun.job_waits SET until = now()")  # the nap is over
    assert store.await_step(job, "nap", None, HOUR).record is not None
    store.await_step(job, "confirm", "done", HOUR)
    parked = store.park(job, "confirm")
    assert parked.run_at > store.now()
    woke = store.signal(job.id, "done", {"ok": True}, key="k")
    assert woke.sent and woke.woke
    assert store.get(job.id).run_at <= store.now()
    again = store.signal(job.id, "done", {"ok": True}, key="k")
    assert not again.sent and not again.woke
    sent = [e.detail for e in store.events(job.id) if e.kind is EventKind.SIGNAL_SENT]
    assert sent == [
        {"name": "confirmed", "key": other.key, "woke": False},
        {"name": "done", "key": "k", "woke": True},
    ]


def claim_one_at(store: Store, conn: psycopg.Connection[Any], job: Job) -> Job:
    """Claim ``job`` now, whatever its run_at."""
    conn.execute("UPDATE jobrun.jobs SET run_at = now() WHERE id = %s", [job.id])
    return claim_one(store)


def test_events_follow_the_event_mode(make_store: Any, conn: psycopg.Connection[Any]) -> None:
    store: Store = make_store(event_mode=EventMode.TERMINAL)
    store.enqueue(new_job(backoff=NOW))
    job = claim_one(store)
    store.signal(job.id, "go", None)
    assert store.await_step(job, "go", "go", HOUR).record is not None
    assert not {e.kind for e in store.events(job.id)} & {
        EventKind.SIGNAL_SENT,
        EventKind.SIGNAL_DELIVERED,
    }


def test_purge_deletes_a_job_s_waits_and_signals(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(backoff=NOW))
    job = claim_one(store)
    store.signal(job.id, "a", 1)
    store.signal(job.id, "b", 2)
    store.await_step(job, "a", "a", HOUR)  # delivered
    store.await_step(job, "b-later", "never", HOUR)  # begun, never over
    store.complete(job)
    time.sleep(0.01)
    assert (count(conn, "job_signals"), count(conn, "job_waits")) == (2, 1)
    assert store.purge(dt.timedelta(0), 100) == 1
    assert (count(conn, "job_signals"), count(conn, "job_waits")) == (0, 0)


@pytest.mark.parametrize(
    ("step", "signal", "seconds"),
    [("", None, 1.0), ("s", "", 1.0), ("s", None, 0.0), ("s", None, float("nan")), ("s", 7, 1.0)],
)
def test_bad_wait_arguments_are_refused_before_anything_is_written(
    store: Store, conn: psycopg.Connection[Any], step: Any, signal: Any, seconds: Any
) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    with pytest.raises(ValidationError):
        store.await_step(job, step, signal, seconds)
    assert count(conn, "job_waits") == 0
