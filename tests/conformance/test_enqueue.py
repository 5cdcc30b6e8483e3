"""Enqueue one job, on either store: what is stored, the clock, the wake-up, idempotency.

Each test runs on the sync Store and on the AsyncStore (see conftest.py).
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import AlreadyExists, DatabaseError, IdempotencyConflict
from jobrun.job.model import Backoff, State
from jobrun.postgres.events import EventMode
from tests.conformance.conftest import Listener, delays
from tests.conformance.drive import Driven
from tests.postgres.conftest import counts, new_job
from tests.postgres.test_store_enqueue import SAME_AS_JSONB

SPECS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "payload": {
        "payload": {"b": [1, 2.5, None], "a": {"x": "é"}},
        "priority": -3,
        "max_attempts": 2,
    },
    "queue": {"queue": "q", "backoff": Backoff(kind="linear", base=2.0, jitter=0.5)},
    "delay": {"delay": dt.timedelta(minutes=3)},
    "run_at": {
        "run_at": dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    },
    "keys": {"idempotency_key": "k-1", "concurrency_key": "tenant"},
    "trace": {"trace_context": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}},
}


def test_enqueue_returns_the_job_as_stored(store: Driven) -> None:
    for fields in SPECS.values():
        spec = new_job(**fields)
        job = store.enqueue(spec)
        assert job == store.get(job.id)
        assert job.id == spec.id and job.id.version == 7  # the client's time-ordered id
        assert (job.state, job.attempts, job.finished_at) == (State.QUEUED, 0, None)
        assert job.lease_owner is None and job.lease_token is None
        assert (job.queue, job.type, job.payload) == (spec.queue, spec.type, spec.payload)
        assert (job.priority, job.max_attempts, job.backoff) == (
            spec.priority,
            spec.max_attempts,
            spec.backoff,
        )
        assert (job.concurrency_key, job.trace_context) == (
            spec.concurrency_key,
            spec.trace_context,
        )
        assert job.created_at.tzinfo is dt.UTC and job.run_at.tzinfo is dt.UTC
        if spec.run_at is not None:
            assert job.run_at == spec.run_at
        else:
            assert job.run_at - job.created_at == (spec.delay or dt.timedelta(0))


def test_enqueue_stamps_the_job_by_the_database_clock_and_writes_its_enqueued_event(
    store: Driven,
) -> None:
    before = store.now()
    job = store.enqueue(new_job())
    after = store.now()
    assert before.tzinfo is dt.UTC
    assert before <= job.created_at <= after
    assert job.run_at == job.created_at == job.updated_at
    (event,) = store.events(job.id)
    assert (event.kind, event.job_id, event.attempt) == ("enqueued", job.id, 0)
    assert event.at.tzinfo is dt.UTC


def test_the_terminal_event_mode_writes_no_enqueued_events(
    make_store: Callable[..., Driven], conn: psycopg.Connection[Any]
) -> None:
    store = make_store(event_mode=EventMode.TERMINAL)
    store.enqueue(new_job())
    store.enqueue_batch([new_job(), new_job(idempotency_key="k")])
    assert counts(conn) == (3, 0, 0)


# -- the wake-up ---------------------------------------------------------------------


def test_every_enqueue_notifies_its_queue_name_on_the_store_channel(
    store: Driven, listen: Callable[..., Listener]
) -> None:
    listener = listen()
    store.enqueue(new_job(queue="emails"))
    store.enqueue(new_job(queue="emails", idempotency_key="k"))
    store.enqueue(new_job(queue="other"))
    assert listener.payloads() == ["emails", "emails", "other"]


def test_a_delayed_enqueue_notifies_its_queue_with_the_milliseconds_left(
    store: Driven, listen: Callable[..., Listener]
) -> None:
    """``<queue>@<ms>``, by the database clock, rounded up; a job already due
    keeps the plain payload."""
    listener = listen()
    store.enqueue(new_job(delay=dt.timedelta(hours=1)))
    store.enqueue(new_job(run_at=store.now() - dt.timedelta(seconds=5)))
    store.enqueue(new_job(delay=dt.timedelta(seconds=2), idempotency_key="k"))
    payloads = listener.payloads()
    assert len(payloads) == 3 and payloads[1] == "default"
    hour, keyed = delays(payloads)
    assert 3_590_000 < hour <= 3_600_000
    assert 1_000 < keyed <= 2_000


def test_the_notify_channel_option_changes_the_channel(
    make_store: Callable[..., Driven], listen: Callable[..., Listener]
) -> None:
    store = make_store(notify_channel="other_channel")
    default, other = listen(), listen("other_channel")
    store.enqueue(new_job())
    assert other.payloads() == ["default"]
    assert default.payloads(wait=0.05) == []


# -- idempotency -----------------------------------------------------------------------


def test_a_replay_with_the_same_body_returns_the_stored_job_writes_and_notifies_nothing(
    store: Driven, conn: psycopg.Connection[Any], listen: Callable[..., Listener]
) -> None:
    first = store.enqueue(new_job(idempotency_key="order-1", payload={"a": 1, "b": [1, 2]}))
    listener = listen()
    again = store.enqueue(new_job(idempotency_key="order-1", payload={"b": [1, 2], "a": 1}))
    assert again == first == store.get(first.id)
    assert listener.payloads() == []
    assert counts(conn) == (1, 1, 0)


CHANGES: list[dict[str, Any]] = [
    {"type": "other.type"},
    {"payload": {"a": 2}},
    {"payload": {"a": True}},
    {"priority": 5},
    {"max_attempts": 3},
    {"backoff": Backoff(base=9.0)},
    {"concurrency_key": "tenant"},
]


def test_a_replay_with_a_different_body_is_an_idempotency_conflict_naming_the_key(
    store: Driven, conn: psycopg.Connection[Any]
) -> None:
    stored = store.enqueue(new_job(idempotency_key="order-7", payload={"a": 1}))
    for change in CHANGES:
        body: dict[str, Any] = {"idempotency_key": "order-7", "payload": {"a": 1}, **change}
        with pytest.raises(IdempotencyConflict) as info:
            store.enqueue(new_job(**body))
        assert (info.value.key, info.value.queue) == ("order-7", "default"), change
        assert "order-7" in str(info.value)
    assert store.get(stored.id) == stored
    assert counts(conn) == (1, 1, 0)


def test_a_key_is_per_queue_and_stays_taken_after_its_job_finished(store: Driven) -> None:
    a = store.enqueue(new_job(idempotency_key="k", queue="a"))
    b = store.enqueue(new_job(idempotency_key="k", queue="b"))
    assert a.id != b.id
    store.cancel(a.id)
    again = store.enqueue(new_job(idempotency_key="k", queue="a"))
    assert again.id == a.id and again.state is State.CANCELLED


def test_an_enqueue_retried_with_the_same_id_is_a_replay_and_another_job_with_it_a_clash(
    store: Driven, conn: psycopg.Connection[Any]
) -> None:
    spec = new_job(payload={"a": 1})
    first = store.enqueue(spec)
    assert store.enqueue(spec) == first  # a retry after a lost COMMIT reply
    with pytest.raises(AlreadyExists):
        store.enqueue(new_job(payload={"a": 2}, id=spec.id))
    with pytest.raises(AlreadyExists):
        store.enqueue(new_job(payload={"a": 1}, id=spec.id, idempotency_key="other"))
    assert counts(conn) == (1, 1, 0)


def test_replays_compare_payloads_as_jsonb(store: Driven) -> None:
    """Numbers as PostgreSQL stores them (1e20 is an int, -0.0 is 0, 1 == 1.0),
    keys in any order: one payload; an array reordered or a number that is a
    string: another."""
    for i, case in enumerate(SAME_AS_JSONB):
        (payload,) = case.values
        first = store.enqueue(new_job(payload=payload, idempotency_key=f"edge-{i}"))
        assert store.enqueue(new_job(payload=payload, idempotency_key=f"edge-{i}")).id == first.id
        unkeyed = new_job(payload=payload)
        assert store.enqueue(unkeyed).id == store.enqueue(unkeyed).id == unkeyed.id  # by its id
    same = [
        ({"n": 1}, {"n": 1.0}),
        ({"n": 10**20}, {"n": 1e20}),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    ]
    for i, (sent, replayed) in enumerate(same):
        first = store.enqueue(new_job(payload=sent, idempotency_key=f"same-{i}"))
        assert store.enqueue(new_job(payload=replayed, idempotency_key=f"same-{i}")).id == first.id
    differ = [
        ({"n": 1e16}, {"n": 1e16 + 2}),
        ({"n": 1}, {"n": "1"}),
        ({"n": [1, 2]}, {"n": [2, 1]}),
    ]
    for i, (sent, replayed) in enumerate(differ):
        store.enqueue(new_job(payload=sent, idempotency_key=f"differ-{i}"))
        with pytest.raises(IdempotencyConflict):
            store.enqueue(new_job(payload=replayed, idempotency_key=f"differ-{i}"))


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_an_unknown_unique_index_is_an_error_naming_it_never_a_silent_replay(
    store: Driven, conn: psycopg.Connection[Any], keyed: bool
) -> None:
    conn.execute(
        "CREATE UNIQUE INDEX jobs_one_per_type ON jobrun.jobs (type) WHERE type = 'only.one'"
    )
    store.enqueue(new_job(type="only.one", **({"idempotency_key": "k1"} if keyed else {})))
    before = counts(conn)
    other = {"idempotency_key": "k2"} if keyed else {}
    with pytest.raises(DatabaseError, match="jobs_one_per_type"):
        store.enqueue(new_job(type="only.one", **other))
    with pytest.raises(DatabaseError, match="jobs_one_per_type"):
        store.enqueue_batch([new_job(type="only.one", **other)])
    assert counts(conn) == before


def test_32_concurrent_enqueues_of_one_key_make_one_row_and_all_get_it(
    store: Driven, conn: psycopg.Connection[Any]
) -> None:
    barrier = threading.Barrier(32)
    ids: list[uuid.UUID] = []
    conflicts: list[IdempotencyConflict] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            payload = {"x": 1} if i < 16 else {"x": 2}
            ids.append(store.enqueue(new_job(idempotency_key="storm", payload=payload)).id)
        except IdempotencyConflict as exc:
            conflicts.append(exc)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    # One body won; the 16 callers of the other got the conflict, the rest the row.
    assert len(ids) == 16 and len(set(ids)) == 1 and len(conflicts) == 16
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (1,)
