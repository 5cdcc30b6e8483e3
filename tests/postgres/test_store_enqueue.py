"""Store.enqueue and enqueue_batch: transaction boundaries, idempotency, the clock."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import IdempotencyConflict, ValidationError
from jobrun.job.model import Backoff, NewJob, State
from jobrun.postgres.store import Store
from tests.postgres.conftest import counts, new_job


def listen(dsn: str, channel: str = "jobrun_jobs") -> psycopg.Connection[Any]:
    c = psycopg.connect(dsn, autocommit=True)
    c.execute(f"LISTEN {channel}")
    return c


def pending_notifies(c: psycopg.Connection[Any], wait: float = 0.3) -> list[str]:
    return [n.payload for n in c.notifies(timeout=wait)]


def test_enqueue_returns_the_stored_job_with_database_defaults(store: Store) -> None:
    job = store.enqueue(new_job(payload={"to": "a@example.com"}, queue="emails", priority=3))
    assert job.state is State.QUEUED
    assert job.attempts == 0
    assert job.queue == "emails"
    assert job.priority == 3
    assert job.payload == {"to": "a@example.com"}
    assert job.lease_owner is None and job.lease_token is None
    assert job.finished_at is None
    assert job.created_at.tzinfo is dt.UTC
    assert store.get(job.id) == job


def test_enqueue_keeps_the_client_assigned_time_ordered_id(store: Store) -> None:
    spec = new_job()
    job = store.enqueue(spec)
    assert job.id == spec.id
    assert job.id.version == 7


def test_run_at_defaults_to_the_database_clock_at_insert(store: Store) -> None:
    job = store.enqueue(new_job())
    assert job.run_at == job.created_at


def test_delay_counts_from_the_database_clock(store: Store) -> None:
    job = store.enqueue(new_job(delay=dt.timedelta(minutes=5)))
    assert job.run_at - job.created_at == dt.timedelta(minutes=5)


def test_explicit_run_at_is_stored_in_utc(store: Store) -> None:
    tz = dt.timezone(dt.timedelta(hours=5))
    when = dt.datetime(2030, 1, 1, 12, 0, tzinfo=tz)
    job = store.enqueue(new_job(run_at=when))
    assert job.run_at == when
    assert job.run_at.tzinfo is dt.UTC


def test_enqueue_writes_an_enqueued_event(store: Store) -> None:
    job = store.enqueue(new_job())
    assert [e.kind for e in store.events(job.id)] == ["enqueued"]


def test_enqueue_notifies_the_queue_name_on_the_store_channel(store: Store, dsn: str) -> None:
    with listen(dsn) as listener:
        store.enqueue(new_job(queue="emails"))
        assert pending_notifies(listener) == ["emails"]


def delays(payloads: list[str], queue: str = "default") -> list[int]:
    """The milliseconds carried by ``<queue>@<ms>`` payloads (a delayed job's wake-up)."""
    return [int(p.split("@")[1]) for p in payloads if p.startswith(f"{queue}@")]


def test_enqueue_of_a_delayed_job_notifies_its_queue_with_the_delay_left(
    store: Store, dsn: str
) -> None:
    """The spec notifies every enqueue; a delayed job's payload carries the
    milliseconds until its run_at by the database clock (rounded up), so a
    worker can wake when it is due. A job due now keeps the plain payload."""
    with listen(dsn) as listener:
        store.enqueue(new_job(delay=dt.timedelta(hours=1)))
        store.enqueue(new_job(run_at=store.now() - dt.timedelta(seconds=5)))  # already due
        store.enqueue(new_job(delay=dt.timedelta(seconds=2), idempotency_key="k"))
        payloads = pending_notifies(listener)
    assert len(payloads) == 3 and payloads[1] == "default"
    hour, keyed = delays(payloads)
    assert 3_590_000 < hour <= 3_600_000
    assert 1_000 < keyed <= 2_000


def test_a_delayed_job_enqueued_in_a_callers_transaction_notifies_at_its_commit(
    store: Store, dsn: str
) -> None:
    with listen(dsn) as listener, psycopg.connect(dsn) as caller:
        store.enqueue(new_job(queue="later", delay=dt.timedelta(minutes=1)), conn=caller)
        assert pending_notifies(listener) == []
        caller.commit()
        (ms,) = delays(pending_notifies(listener), "later")
    assert 50_000 < ms <= 60_000


def test_notify_channel_option_changes_the_channel(make_store: Any, dsn: str) -> None:
    store = make_store(notify_channel="other_channel")
    with listen(dsn, "other_channel") as listener:
        store.enqueue(new_job())
        assert pending_notifies(listener) == ["default"]


def test_transactional_enqueue_exists_and_notifies_only_after_the_caller_commits(
    store: Store, dsn: str
) -> None:
    with listen(dsn) as listener, psycopg.connect(dsn) as caller:
        caller.execute("SELECT 1")  # the caller's transaction is open
        job = store.enqueue(new_job(), conn=caller)
        assert pending_notifies(listener) == []
        with psycopg.connect(dsn) as other:
            assert other.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (0,)
        caller.commit()
        assert pending_notifies(listener) == ["default"]
        assert store.get(job.id).state is State.QUEUED


def test_transactional_enqueue_rolled_back_leaves_no_row_and_no_notification(
    store: Store, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with listen(dsn) as listener, psycopg.connect(dsn) as caller:
        caller.execute("CREATE TEMP TABLE t (x int)")
        store.enqueue(new_job(), conn=caller)
        store.enqueue_batch([new_job(), new_job()], conn=caller)
        caller.rollback()
        assert pending_notifies(listener) == []
    assert counts(conn) == (0, 0, 0)


def test_transactional_enqueue_conflict_does_not_abort_the_callers_transaction(
    store: Store, dsn: str
) -> None:
    store.enqueue(new_job(idempotency_key="k", payload={"a": 1}))
    with psycopg.connect(dsn) as caller:
        caller.execute("CREATE TEMP TABLE t (x int)")
        with pytest.raises(IdempotencyConflict):
            store.enqueue(new_job(idempotency_key="k", payload={"a": 2}), conn=caller)
        caller.execute("INSERT INTO t VALUES (1)")  # still usable
        caller.commit()


def test_a_first_enqueue_on_a_connection_not_in_autocommit_joins_the_callers_transaction(
    store: Store, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # psycopg's default: the caller's transaction begins with its first
    # statement, which here is the enqueue itself.
    with psycopg.connect(dsn) as caller:
        store.enqueue(new_job(), conn=caller)
        store.enqueue_batch([new_job(), new_job()], conn=caller)
        caller.rollback()
    assert counts(conn) == (0, 0, 0)
    with psycopg.connect(dsn) as caller:
        job = store.enqueue(new_job(), conn=caller)
        with psycopg.connect(dsn) as other:
            assert other.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (0,)
        caller.commit()
    assert store.get(job.id).state is State.QUEUED


def test_enqueue_on_a_connection_without_a_transaction_commits_its_own(
    store: Store, dsn: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as caller:
        job = store.enqueue(new_job(), conn=caller)
    assert store.get(job.id).id == job.id


def test_enqueue_on_an_aborted_transaction_is_a_validation_error(store: Store, dsn: str) -> None:
    with psycopg.connect(dsn) as caller:
        with pytest.raises(psycopg.errors.DivisionByZero):
            caller.execute("SELECT 1/0")
        with pytest.raises(ValidationError):
            store.enqueue(new_job(), conn=caller)


def test_replay_with_the_same_body_returns_the_stored_job(store: Store) -> None:
    first = store.enqueue(new_job(idempotency_key="order-1", payload={"a": 1, "b": [1, 2]}))
    again = store.enqueue(new_job(idempotency_key="order-1", payload={"b": [1, 2], "a": 1}))
    assert again.id == first.id
    assert again == store.get(first.id)


def test_replay_writes_no_event_and_notifies_nobody(store: Store, dsn: str) -> None:
    first = store.enqueue(new_job(idempotency_key="k"))
    with listen(dsn) as listener:
        store.enqueue(new_job(idempotency_key="k"))
        assert pending_notifies(listener) == []
    assert len(store.events(first.id)) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"type": "other.type"},
        {"payload": {"a": 2}},
        {"payload": {"a": True}},
        {"priority": 5},
        {"max_attempts": 3},
        {"backoff": Backoff(base=9.0)},
    ],
)
def test_replay_with_a_different_body_raises_idempotency_conflict_naming_the_key(
    store: Store, change: dict[str, Any]
) -> None:
    store.enqueue(new_job(idempotency_key="order-7", payload={"a": 1}))
    body: dict[str, Any] = {"idempotency_key": "order-7", "payload": {"a": 1}, **change}
    with pytest.raises(IdempotencyConflict) as info:
        store.enqueue(new_job(**body))
    assert info.value.key == "order-7"
    assert "order-7" in str(info.value)


def test_the_same_key_in_two_queues_makes_two_jobs(store: Store) -> None:
    a = store.enqueue(new_job(idempotency_key="k", queue="a"))
    b = store.enqueue(new_job(idempotency_key="k", queue="b"))
    assert a.id != b.id


def test_a_key_stays_taken_after_its_job_finished(store: Store) -> None:
    first = store.enqueue(new_job(idempotency_key="k"))
    store.cancel(first.id)
    again = store.enqueue(new_job(idempotency_key="k"))
    assert again.id == first.id
    assert again.state is State.CANCELLED


def test_32_threads_enqueuing_one_key_make_one_row_and_all_get_it(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    barrier = threading.Barrier(32)
    results: list[uuid.UUID] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait()
            results.append(store.enqueue(new_job(idempotency_key="storm", payload={"x": 1})).id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(results) == 32 and len(set(results)) == 1
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (1,)


def test_32_threads_with_different_bodies_get_the_row_or_the_conflict(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    barrier = threading.Barrier(32)
    ids: list[uuid.UUID] = []
    conflicts: list[IdempotencyConflict] = []
    other: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            ids.append(store.enqueue(new_job(idempotency_key="storm", payload={"x": i % 2})).id)
        except IdempotencyConflict as exc:
            conflicts.append(exc)
        except BaseException as exc:
            other.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert other == []
    assert len(ids) + len(conflicts) == 32
    assert len(set(ids)) == 1 and conflicts
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (1,)


# -- enqueue_batch -------------------------------------------------------------


def test_enqueue_batch_inserts_every_job_with_events_and_one_notification_per_queue(
    store: Store, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    jobs = [new_job(queue="a") for _ in range(3)] + [new_job(queue="b") for _ in range(2)]
    with listen(dsn) as listener:
        result = store.enqueue_batch(jobs)
        assert sorted(pending_notifies(listener)) == ["a", "b"]
    assert result.inserted == 5 and result.replayed == ()
    assert conn.execute("SELECT count(*) FROM jobrun.jobs WHERE state = 'queued'").fetchone() == (
        5,
    )
    assert conn.execute(
        "SELECT count(*) FROM jobrun.job_events WHERE kind = 'enqueued'"
    ).fetchone() == (5,)
    stored = store.get(jobs[0].id)
    assert stored.run_at == stored.created_at


def test_enqueue_batch_wakes_each_queue_for_its_due_jobs_and_its_soonest_delayed_one(
    store: Store, dsn: str
) -> None:
    jobs = [
        new_job(queue="a"),
        new_job(queue="a", delay=dt.timedelta(minutes=5)),
        new_job(queue="a", delay=dt.timedelta(minutes=1), idempotency_key="k"),
        new_job(queue="b", delay=dt.timedelta(seconds=30)),
    ]
    with listen(dsn) as listener:
        store.enqueue_batch(jobs)
        payloads = pending_notifies(listener)
    assert sorted(p.split("@")[0] for p in payloads) == ["a", "a", "b"]
    assert "a" in payloads
    (a_ms,) = delays(payloads, "a")
    (b_ms,) = delays(payloads, "b")
    assert 50_000 < a_ms <= 60_000
    assert 20_000 < b_ms <= 30_000


def test_enqueue_many_of_delayed_jobs_notifies_their_delay(store: Store, dsn: str) -> None:
    with listen(dsn) as listener:
        store.enqueue_many(new_job(queue="m", delay=dt.timedelta(seconds=10)), [{}, {}, {}])
        (ms,) = delays(pending_notifies(listener), "m")
    assert 5_000 < ms <= 10_000


def test_enqueue_batch_keeps_payloads_backoffs_and_delays(store: Store) -> None:
    spec = new_job(
        payload={"deep": {"list": [1, 2.5, "x", None, True]}},
        backoff=Backoff(kind="linear", base=2.0),
        delay=dt.timedelta(seconds=90),
        priority=-4,
        max_attempts=7,
    )
    store.enqueue_batch([spec])
    job = store.get(spec.id)
    assert job.payload == spec.payload
    assert job.backoff == spec.backoff
    assert job.priority == -4 and job.max_attempts == 7
    assert job.run_at - job.created_at == dt.timedelta(seconds=90)


def test_enqueue_batch_of_100k_jobs_from_a_generator(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    result = store.enqueue_batch(new_job(payload={"i": i}) for i in range(100_000))
    assert result.inserted == 100_000
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (100_000,)


def test_enqueue_batch_replays_stored_identical_keys(store: Store) -> None:
    stored = store.enqueue(new_job(idempotency_key="k1", payload={"a": 1}))
    result = store.enqueue_batch(
        [new_job(idempotency_key="k1", payload={"a": 1}), new_job(idempotency_key="k2"), new_job()]
    )
    assert result.inserted == 2
    assert [j.id for j in result.replayed] == [stored.id]


def test_enqueue_batch_retried_after_a_lost_commit_returns_the_stored_jobs(store: Store) -> None:
    batch = [new_job(idempotency_key=f"k{i}") for i in range(3)]
    store.enqueue_batch(batch)
    retry = [new_job(idempotency_key=f"k{i}") for i in range(3)]
    result = store.enqueue_batch(retry)
    assert result.inserted == 0
    assert sorted(j.id for j in result.replayed) == sorted(j.id for j in batch)


def test_enqueue_batch_with_a_conflicting_key_writes_nothing(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(idempotency_key="k1", payload={"a": 1}))
    before = counts(conn)
    with pytest.raises(IdempotencyConflict) as info:
        store.enqueue_batch(
            [new_job() for _ in range(10)]
            + [new_job(idempotency_key="k1", payload={"a": 2}), new_job(idempotency_key="k9")]
        )
    assert info.value.key == "k1"
    assert counts(conn) == before


def test_enqueue_batch_with_a_key_twice_is_a_validation_error(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ValidationError, match="twice"):
        store.enqueue_batch([new_job(idempotency_key="k"), new_job(idempotency_key="k")])
    with pytest.raises(ValidationError, match="twice"):
        store.enqueue_batch(
            new_job(idempotency_key="k" if i in (3, 7) else None) for i in range(10)
        )
    assert counts(conn) == (0, 0, 0)


def test_enqueue_batch_of_nothing_is_a_validation_error(store: Store) -> None:
    with pytest.raises(ValidationError, match="empty"):
        store.enqueue_batch([])
    with pytest.raises(ValidationError, match="empty"):
        store.enqueue_batch(iter([]))


def test_enqueue_batch_with_a_foreign_item_writes_nothing(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ValidationError):
        store.enqueue_batch([new_job(), {"type": "x"}])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        store.enqueue_batch(iter([new_job(), "nope"]))  # type: ignore[list-item]
    assert counts(conn) == (0, 0, 0)


def test_two_batches_with_overlapping_keys_in_opposite_orders_do_not_deadlock(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    keys = [f"k{i}" for i in range(200)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(order: list[str]) -> None:
        try:
            barrier.wait()
            store.enqueue_batch([new_job(idempotency_key=k) for k in order])
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(keys,)),
        threading.Thread(target=run, args=(list(reversed(keys)),)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (200,)


def test_terminal_event_mode_writes_no_enqueued_events(
    terminal_store: Store, conn: psycopg.Connection[Any]
) -> None:
    terminal_store.enqueue(new_job())
    terminal_store.enqueue_batch([new_job(), new_job(idempotency_key="k")])
    assert conn.execute("SELECT count(*) FROM jobrun.job_events").fetchone() == (0,)


def test_enqueue_refuses_anything_but_a_new_job(store: Store) -> None:
    with pytest.raises(ValidationError):
        store.enqueue({"type": "x"})  # type: ignore[arg-type]


def test_timestamps_come_back_utc_whatever_the_callers_time_zone(store: Store, dsn: str) -> None:
    with psycopg.connect(dsn) as caller:
        caller.execute("SET TIME ZONE 'Asia/Tokyo'")
        job = store.enqueue(new_job(), conn=caller)
        caller.commit()
    assert job.created_at.tzinfo is dt.UTC
    assert job.run_at.tzinfo is dt.UTC


def test_new_job_defaults() -> None:
    job = NewJob(type="t")
    assert job.queue == "default" and job.payload == {} and job.max_attempts == 25


# -- retries of a lost COMMIT reply: the client's id identifies the job ---------


def test_an_enqueue_retried_with_the_same_id_is_a_replay(store: Store) -> None:
    spec = new_job(payload={"a": 1})
    first = store.enqueue(spec)
    again = store.enqueue(spec)
    assert again == first
    assert len(store.events(first.id)) == 1


def test_a_different_job_with_a_taken_id_is_already_exists(store: Store) -> None:
    from jobrun.job.errors import AlreadyExists  # noqa: PLC0415

    spec = new_job(payload={"a": 1})
    store.enqueue(spec)
    with pytest.raises(AlreadyExists):
        store.enqueue(new_job(payload={"a": 2}, id=spec.id))
    with pytest.raises(AlreadyExists):
        store.enqueue(new_job(payload={"a": 1}, id=spec.id, idempotency_key="other"))


def test_a_batch_retried_without_keys_replays_the_stored_jobs(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    batch = [new_job(payload={"i": i}) for i in range(20)]
    store.enqueue_batch(batch[:10])
    result = store.enqueue_batch(batch)  # half of it was stored already
    assert result.inserted == 10
    assert sorted(j.id for j in result.replayed) == sorted(j.id for j in batch[:10])
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (20,)
    assert conn.execute("SELECT count(*) FROM jobrun.job_events").fetchone() == (20,)


def test_a_batch_clashing_with_a_stored_id_writes_nothing(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    from jobrun.job.errors import AlreadyExists  # noqa: PLC0415

    stored = store.enqueue(new_job(payload={"a": 1}))
    before = counts(conn)
    with pytest.raises(AlreadyExists):
        store.enqueue_batch([new_job(), new_job(payload={"a": 2}, id=stored.id), new_job()])
    with pytest.raises(AlreadyExists):
        store.enqueue_batch([new_job(idempotency_key="k", id=stored.id)])
    assert counts(conn) == before


# -- a replay compares payloads the way jsonb does ------------------------------

# Payloads that are one jsonb value however Python spells them. PostgreSQL
# stores numbers as numeric: 1e20 comes back as the int 100000000000000000000,
# -0.0 as 0, 5e-324 as a 324-digit decimal; 1 and 1.0 are equal.
SAME_AS_JSONB = [
    pytest.param({"n": 1e16}, id="1e16"),
    pytest.param({"n": 1e20}, id="1e20"),
    pytest.param({"n": 1e308}, id="1e308"),
    pytest.param({"n": 5e-324}, id="5e-324"),
    pytest.param({"n": -0.0}, id="-0.0"),
    pytest.param({"n": 2**64 + 1}, id="int-beyond-2**63"),
    pytest.param({"n": -(2**70)}, id="negative-int-beyond-2**63"),
    pytest.param({"n": 0.1 + 0.2}, id="0.30000000000000004"),
    pytest.param({"n": 123456789.12345679}, id="big-decimal"),
    pytest.param({"n": 1.7976931348623157e308}, id="max-float"),
    pytest.param({"nested": [{"x": 1e21, "y": [-0.0, 1e-7]}]}, id="nested"),
]


@pytest.mark.parametrize("payload", SAME_AS_JSONB)
def test_an_identical_replay_of_a_numeric_edge_case_is_never_a_conflict(
    store: Store, payload: dict[str, Any]
) -> None:
    first = store.enqueue(new_job(payload=payload, idempotency_key="k"))
    again = store.enqueue(new_job(payload=payload, idempotency_key="k"))
    assert again.id == first.id
    result = store.enqueue_batch([new_job(payload=payload, idempotency_key="k")])
    assert result.inserted == 0 and [j.id for j in result.replayed] == [first.id]


@pytest.mark.parametrize("payload", SAME_AS_JSONB)
def test_a_retried_batch_of_a_numeric_edge_case_replays_by_id(
    store: Store, payload: dict[str, Any]
) -> None:
    batch = [new_job(payload=payload), new_job(payload=payload, idempotency_key="k")]
    store.enqueue_batch(batch)
    result = store.enqueue_batch(batch)
    assert result.inserted == 0
    assert sorted(j.id for j in result.replayed) == sorted(j.id for j in batch)
    assert store.enqueue(batch[0]).id == batch[0].id


@pytest.mark.parametrize(
    ("sent", "replayed"),
    [
        pytest.param({"n": 1}, {"n": 1.0}, id="1-vs-1.0"),
        pytest.param({"n": 1.0}, {"n": 1}, id="1.0-vs-1"),
        pytest.param({"n": 0}, {"n": -0.0}, id="0-vs--0.0"),
        pytest.param({"n": 10**20}, {"n": 1e20}, id="10**20-vs-1e20"),
        pytest.param({"a": 1, "b": 2}, {"b": 2, "a": 1}, id="key-order"),
    ],
)
def test_payloads_equal_as_jsonb_are_one_payload_to_a_replay(
    store: Store, sent: dict[str, Any], replayed: dict[str, Any]
) -> None:
    first = store.enqueue(new_job(payload=sent, idempotency_key="k"))
    assert store.enqueue(new_job(payload=replayed, idempotency_key="k")).id == first.id
    assert store.enqueue_batch([new_job(payload=replayed, idempotency_key="k")]).replayed


@pytest.mark.parametrize(
    ("sent", "replayed"),
    [
        pytest.param({"n": 1}, {"n": 2}, id="1-vs-2"),
        pytest.param({"n": 1e16}, {"n": 1e16 + 2}, id="1e16-vs-1e16+2"),
        pytest.param({"n": 2**64}, {"n": 2**64 + 1}, id="2**64-vs-2**64+1"),
        pytest.param({"n": 1}, {"n": "1"}, id="number-vs-string"),
        pytest.param({"n": [1, 2]}, {"n": [2, 1]}, id="array-order"),
    ],
)
def test_payloads_that_differ_as_jsonb_are_still_a_conflict(
    store: Store, sent: dict[str, Any], replayed: dict[str, Any]
) -> None:
    store.enqueue(new_job(payload=sent, idempotency_key="k"))
    with pytest.raises(IdempotencyConflict):
        store.enqueue(new_job(payload=replayed, idempotency_key="k"))
    with pytest.raises(IdempotencyConflict):
        store.enqueue_batch([new_job(payload=replayed, idempotency_key="k")])


# -- only the intended conflicts are replays ---------------------------------------


@pytest.fixture
def one_per_type(conn: psycopg.Connection[Any]) -> None:
    """A unique index jobrun knows nothing of, as a later migration might add."""
    conn.execute(
        "CREATE UNIQUE INDEX jobs_one_per_type ON jobrun.jobs (type) WHERE type = 'only.one'"
    )


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_an_unknown_unique_index_is_an_error_naming_it_never_a_silent_replay(
    store: Store, conn: psycopg.Connection[Any], one_per_type: None, keyed: bool
) -> None:
    from jobrun.job.errors import DatabaseError  # noqa: PLC0415

    key = {"idempotency_key": "k1"} if keyed else {}
    store.enqueue(new_job(type="only.one", **key))
    before = counts(conn)
    other = {"idempotency_key": "k2"} if keyed else {}
    with pytest.raises(DatabaseError, match="jobs_one_per_type"):
        store.enqueue(new_job(type="only.one", **other))
    with pytest.raises(DatabaseError, match="jobs_one_per_type"):
        store.enqueue_batch([new_job(type="only.one", **other)])
    with pytest.raises(DatabaseError, match="jobs_one_per_type"), conn.transaction():
        store.enqueue(new_job(type="only.one", **other), conn=conn)
    assert counts(conn) == before


def test_a_transactional_enqueue_whose_id_is_taken_leaves_the_callers_transaction_usable(
    store: Store, dsn: str
) -> None:
    from jobrun.job.errors import AlreadyExists  # noqa: PLC0415

    stored = store.enqueue(new_job())
    with psycopg.connect(dsn) as c:
        with pytest.raises(AlreadyExists):
            store.enqueue(new_job(id=stored.id, idempotency_key="fresh"), conn=c)
        other = store.enqueue(new_job(), conn=c)
        c.commit()
    assert store.get(other.id).state is State.QUEUED
