"""Many jobs at once, on either store or client: enqueue_batch and enqueue_many.

Both are one transaction, all or nothing, streamed through COPY in chunks
(``BATCH_CHUNK`` jobs) whatever the iterable; keyed jobs go last, in
(queue, key) order, so that two batches never deadlock on their keys; one
wake-up per queue when the transaction commits.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import AlreadyExists, IdempotencyConflict, ValidationError
from jobrun.job.model import Backoff, State
from jobrun.postgres.store import BATCH_CHUNK
from tests.conformance.conftest import Listener, delays
from tests.conformance.drive import Driven
from tests.postgres.conftest import counts, new_job

# -- enqueue_batch ---------------------------------------------------------------------


def test_a_batch_stores_every_job_with_its_event_and_wakes_each_queue_once(
    store: Driven, conn: psycopg.Connection[Any], listen: Callable[..., Listener]
) -> None:
    jobs = [new_job(queue="a") for _ in range(3)] + [
        new_job(queue="b", idempotency_key=f"k{i}") for i in range(2)
    ]
    listener = listen()
    before = store.now()
    result = store.enqueue_batch(iter(jobs))
    assert sorted(listener.payloads()) == ["a", "b"]
    assert (result.inserted, result.replayed) == (5, ())
    assert counts(conn) == (5, 5, 0)
    stored = [store.get(j.id) for j in jobs]
    assert {j.state for j in stored} == {State.QUEUED}
    assert len({j.created_at for j in stored}) == 1  # one transaction, one clock reading
    assert before <= stored[0].created_at == stored[0].run_at <= store.now()


def test_a_batch_keeps_every_field_of_its_jobs(store: Driven) -> None:
    spec = new_job(
        payload={"deep": {"list": [1, 2.5, "x", None, True]}},
        backoff=Backoff(kind="linear", base=2.0),
        delay=dt.timedelta(seconds=90),
        priority=-4,
        max_attempts=7,
        concurrency_key="tenant",
        trace_context={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
    )
    store.enqueue_batch([spec, new_job(idempotency_key="k", queue="q")])
    job = store.get(spec.id)
    assert (job.payload, job.backoff, job.priority, job.max_attempts) == (
        spec.payload,
        spec.backoff,
        -4,
        7,
    )
    assert (job.concurrency_key, job.trace_context) == ("tenant", spec.trace_context)
    assert job.run_at - job.created_at == dt.timedelta(seconds=90)


def test_a_batch_writes_its_plain_jobs_in_order_then_its_keyed_ones_by_queue_and_key(
    store: Driven, conn: psycopg.Connection[Any]
) -> None:
    jobs = [
        new_job(queue="b", idempotency_key="k2"),
        new_job(queue="z"),
        new_job(queue="a", idempotency_key="k9"),
        new_job(queue="a"),
        new_job(queue="a", idempotency_key="k1"),
    ]
    store.enqueue_batch(jobs)
    written = [row[0] for row in conn.execute("SELECT job_id FROM jobrun.job_events ORDER BY id")]
    assert written == [jobs[1].id, jobs[3].id, jobs[4].id, jobs[2].id, jobs[0].id]


def test_two_batches_with_overlapping_keys_in_opposite_orders_do_not_deadlock(
    store: Driven, conn: psycopg.Connection[Any]
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


def test_a_batch_wakes_each_queue_for_its_due_jobs_and_its_soonest_delayed_one(
    store: Driven, listen: Callable[..., Listener]
) -> None:
    listener = listen()
    store.enqueue_batch(
        [
            new_job(queue="a"),
            new_job(queue="a", delay=dt.timedelta(minutes=5)),
            new_job(queue="a", delay=dt.timedelta(minutes=1), idempotency_key="k"),
            new_job(queue="b", delay=dt.timedelta(seconds=30)),
        ]
    )
    payloads = listener.payloads()
    assert sorted(p.split("@")[0] for p in payloads) == ["a", "a", "b"] and "a" in payloads
    (a_ms,) = delays(payloads, "a")
    (b_ms,) = delays(payloads, "b")
    assert 50_000 < a_ms <= 60_000
    assert 20_000 < b_ms <= 30_000


def test_a_batch_from_a_generator_streams_through_several_chunks(
    store: Driven, conn: psycopg.Connection[Any]
) -> None:
    n = 2 * BATCH_CHUNK + 7
    keyed = {5, BATCH_CHUNK + 1, n - 1}
    result = store.enqueue_batch(
        new_job(payload={"i": i}, idempotency_key=f"k{i}" if i in keyed else None) for i in range(n)
    )
    assert (result.inserted, result.replayed) == (n, ())
    assert conn.execute(
        "SELECT count(*), count(DISTINCT payload->>'i'), count(idempotency_key) FROM jobrun.jobs"
    ).fetchone() == (n, n, 3)
    assert counts(conn) == (n, n, 0)


def test_a_batch_replays_stored_keys_and_ids_and_inserts_the_rest(
    store: Driven, conn: psycopg.Connection[Any], listen: Callable[..., Listener]
) -> None:
    stored = store.enqueue(new_job(idempotency_key="k1", payload={"a": 1}))
    plain = [new_job(payload={"i": i}) for i in range(6)]
    store.enqueue_batch(plain[:3])
    result = store.enqueue_batch(
        [new_job(idempotency_key="k1", payload={"a": 1}), new_job(idempotency_key="k2"), *plain]
    )
    assert result.inserted == 4
    assert sorted(j.id for j in result.replayed) == sorted([stored.id, *(j.id for j in plain[:3])])
    assert counts(conn) == (8, 8, 0)
    listener = listen()
    again = store.enqueue_batch(plain)  # all replays: nothing new, no wake-up
    assert again.inserted == 0 and len(again.replayed) == 6
    assert listener.payloads() == []


def test_a_batch_with_a_conflict_or_a_clash_anywhere_writes_nothing(
    store: Driven, conn: psycopg.Connection[Any], listen: Callable[..., Listener]
) -> None:
    stored = store.enqueue(new_job(idempotency_key="k1", payload={"a": 1}))
    before = counts(conn)
    listener = listen()
    with pytest.raises(IdempotencyConflict) as info:
        store.enqueue_batch(
            [new_job() for _ in range(10)]
            + [new_job(idempotency_key="k1", payload={"a": 2}), new_job(idempotency_key="k9")]
        )
    assert info.value.key == "k1"
    with pytest.raises(AlreadyExists):
        store.enqueue_batch([new_job(), new_job(payload={"a": 2}, id=stored.id), new_job()])
    with pytest.raises(AlreadyExists):
        store.enqueue_batch([new_job(idempotency_key="k", id=stored.id)])
    with pytest.raises(ValidationError):  # a foreign item after a whole chunk was sent
        store.enqueue_batch(
            iter([*(new_job() for _ in range(BATCH_CHUNK + 5)), "nope"])  # type: ignore[list-item]
        )
    assert counts(conn) == before
    assert listener.payloads() == []


def test_a_batch_refuses_nothing_a_key_twice_and_foreign_items(
    store: Driven, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ValidationError, match="empty"):
        store.enqueue_batch([])
    with pytest.raises(ValidationError, match="empty"):
        store.enqueue_batch(iter([]))
    with pytest.raises(ValidationError, match="twice"):
        store.enqueue_batch([new_job(idempotency_key="k"), new_job(idempotency_key="k")])
    with pytest.raises(ValidationError, match="twice"):
        store.enqueue_batch(
            new_job(idempotency_key="k" if i in (3, 7) else None) for i in range(10)
        )
    with pytest.raises(ValidationError):
        store.enqueue_batch([new_job(), {"type": "x"}])
    assert counts(conn) == (0, 0, 0)


# -- enqueue_many (the client's columnar batch) ------------------------------------------


def test_enqueue_many_makes_one_job_per_payload_with_the_shared_fields_and_one_wakeup(
    client: Driven, conn: psycopg.Connection[Any], listen: Callable[..., Listener]
) -> None:
    backoff = Backoff(kind="constant", base=3.0)
    listener = listen()
    result = client.enqueue_many(
        "report.build",
        [{"month": m} for m in range(1, 13)] + [None],
        queue="reports",
        priority=-5,
        max_attempts=3,
        backoff=backoff,
        delay=dt.timedelta(seconds=10),
        concurrency_key="tenant-7",
    )
    (ms,) = delays(listener.payloads(), "reports")  # one wake-up, carrying the delay
    assert 5_000 < ms <= 10_000
    assert (result.inserted, result.replayed) == (13, ())
    assert counts(conn) == (13, 13, 0)
    jobs = client.list(queue="reports")
    assert sorted(str(j.payload) for j in jobs) == sorted(
        [str({"month": m}) for m in range(1, 13)] + ["{}"]
    )
    assert len({j.id for j in jobs}) == 13
    assert {
        (j.type, j.priority, j.max_attempts, j.backoff, j.concurrency_key, j.idempotency_key)
        for j in jobs
    } == {("report.build", -5, 3, backoff, "tenant-7", None)}
    assert {j.run_at - j.created_at for j in jobs} == {dt.timedelta(seconds=10)}


def test_enqueue_many_streams_its_payloads_into_the_copy_as_they_are_read(
    client: Driven, conn: psycopg.Connection[Any]
) -> None:
    """The payloads are checked and sent as the generator yields them, while the
    COPY runs: the server is already reading the batch before its first chunk
    has been read whole (bounded memory; the checks overlap the server's work)."""
    seen: list[int] = []

    def copying() -> int:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'active' AND query LIKE 'COPY %%'"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def payloads() -> Iterator[dict[str, int]]:
        for i in range(3 * BATCH_CHUNK // 2):
            if i == BATCH_CHUNK // 2:
                seen.append(copying())
            yield {"i": i}

    result = client.enqueue_many("t", payloads())
    assert result.inserted == 3 * BATCH_CHUNK // 2
    assert seen == [1], "no COPY was running while the first chunk's payloads were read"


def test_enqueue_many_with_a_bad_payload_names_its_position_and_writes_nothing(
    client: Driven, conn: psycopg.Connection[Any], listen: Callable[..., Listener]
) -> None:
    listener = listen()
    listed: list[Any] = [{"i": i} for i in range(BATCH_CHUNK + 10)]
    listed[BATCH_CHUNK + 3] = {"bad": float("nan")}
    with pytest.raises(ValidationError) as raised:
        client.enqueue_many("t", listed)
    assert raised.value.field == f"payloads[{BATCH_CHUNK + 3}]"

    def streamed() -> Iterator[Any]:  # the first chunk is sent before the bad one is read
        for i in range(2 * BATCH_CHUNK):
            yield {"i": i} if i != BATCH_CHUNK + 1 else ["not", "an", "object"]

    with pytest.raises(ValidationError) as raised:
        client.enqueue_many("t", streamed())
    assert raised.value.field == f"payloads[{BATCH_CHUNK + 1}]"
    with pytest.raises(ValidationError, match="empty"):
        client.enqueue_many("t", iter([]))
    assert listener.payloads() == []
    assert counts(conn) == (0, 0, 0)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"queue": "Not A Queue"}, "queue"),
        ({"priority": "high"}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"run_at": dt.datetime(2030, 1, 1)}, "run_at"),  # noqa: DTZ001 - naive on purpose
    ],
    ids=["queue", "priority", "max_attempts", "run_at"],
)
def test_enqueue_many_refuses_a_bad_shared_field_before_reading_a_payload(
    client: Driven, conn: psycopg.Connection[Any], fields: dict[str, Any], field: str
) -> None:
    read: list[int] = []

    def payloads() -> Iterator[Any]:
        read.append(1)
        yield {}

    with pytest.raises(ValidationError) as raised:
        client.enqueue_many("t", payloads(), **fields)
    assert raised.value.field == field
    assert read == []
    assert counts(conn) == (0, 0, 0)
