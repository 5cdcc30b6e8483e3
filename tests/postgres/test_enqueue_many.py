"""Client.enqueue_many: one job of a type per payload, the columnar form of a batch.

The shared fields are checked once and each payload as in an enqueue; a
bad one names its position and nothing is written, whether the payloads
came as a list (checked whole before any SQL) or streamed from a generator
(rolled back). The rest is enqueue_batch's: COPY, the "enqueued" events,
one wake-up per queue when the transaction commits.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from jobrun import Backoff, Client, NewJob, State
from jobrun.job.errors import ValidationError
from jobrun.job.model import jobs_like
from jobrun.postgres.store import BATCH_CHUNK, Store
from tests.postgres.conftest import counts


@pytest.fixture
def client(store: Store) -> Client:
    return Client(store)


def listen(dsn: str) -> psycopg.Connection[Any]:
    c = psycopg.connect(dsn, autocommit=True)
    c.execute("LISTEN jobrun_jobs")
    return c


def wakeups(c: psycopg.Connection[Any], wait: float = 0.3) -> list[str]:
    return [n.payload for n in c.notifies(timeout=wait)]


def test_enqueue_many_makes_one_job_per_payload_with_the_shared_fields(
    client: Client, conn: psycopg.Connection[Any], dsn: str
) -> None:
    backoff = Backoff(kind="constant", base=3.0)
    with listen(dsn) as listener:
        result = client.enqueue_many(
            "report.build",
            [{"month": m} for m in range(1, 13)],
            queue="reports",
            priority=-5,
            max_attempts=3,
            backoff=backoff,
            delay=dt.timedelta(minutes=10),
            concurrency_key="tenant-7",
        )
        # One wake-up for the batch, carrying the delay of its jobs (reports@<ms>).
        assert [w.split("@")[0] for w in wakeups(listener)] == ["reports"]
    assert (result.inserted, result.replayed) == (12, ())
    assert counts(conn) == (12, 12, 0)  # a job and its "enqueued" event each
    jobs = sorted(client.list(queue="reports"), key=lambda j: j.payload["month"])
    assert [j.payload for j in jobs] == [{"month": m} for m in range(1, 13)]
    assert len({j.id for j in jobs}) == 12
    for job in jobs:
        assert (job.type, job.queue, job.priority, job.max_attempts) == (
            "report.build",
            "reports",
            -5,
            3,
        )
        assert (job.backoff, job.concurrency_key, job.state) == (backoff, "tenant-7", State.QUEUED)
        assert job.run_at - job.created_at == dt.timedelta(minutes=10)
        assert job.idempotency_key is None


def test_enqueue_many_takes_none_as_an_empty_payload_as_enqueue_does(
    client: Client,
) -> None:
    client.enqueue_many("t", [None, {"a": 1}])
    assert sorted(str(j.payload) for j in client.list()) == ["{'a': 1}", "{}"]


def test_a_bad_payload_in_a_list_names_its_position_and_nothing_is_written(
    client: Client, conn: psycopg.Connection[Any], dsn: str
) -> None:
    payloads: list[Any] = [{"i": i} for i in range(BATCH_CHUNK + 10)]
    payloads[BATCH_CHUNK + 3] = {"bad": float("nan")}
    with listen(dsn) as listener:
        with pytest.raises(ValidationError) as raised:
            client.enqueue_many("t", payloads)
        assert wakeups(listener) == []
    assert raised.value.field == f"payloads[{BATCH_CHUNK + 3}]"
    assert counts(conn) == (0, 0, 0)


def test_a_bad_payload_streamed_after_a_chunk_was_sent_rolls_the_batch_back(
    client: Client, conn: psycopg.Connection[Any], dsn: str
) -> None:
    sent: list[int] = []

    def payloads() -> Iterator[Any]:
        for i in range(2 * BATCH_CHUNK):
            sent.append(i)
            yield {"i": i} if i != BATCH_CHUNK + 1 else ["not", "an", "object"]

    with listen(dsn) as listener:
        with pytest.raises(ValidationError) as raised:
            client.enqueue_many("t", payloads())
        assert wakeups(listener) == []
    assert raised.value.field == f"payloads[{BATCH_CHUNK + 1}]"
    assert len(sent) > BATCH_CHUNK  # the first chunk had gone to the server
    assert counts(conn) == (0, 0, 0)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"queue": "Not A Queue"}, "queue"),
        ({"priority": "high"}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"run_at": dt.datetime(2030, 1, 1)}, "run_at"),  # noqa: DTZ001 - naive on purpose
    ],
)
def test_a_bad_shared_field_is_refused_before_any_payload_is_read(
    client: Client, conn: psycopg.Connection[Any], fields: dict[str, Any], field: str
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


def test_an_empty_batch_is_a_validation_error_as_a_list_or_a_generator(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ValidationError, match="empty"):
        client.enqueue_many("t", [])
    with pytest.raises(ValidationError, match="empty"):
        client.enqueue_many("t", iter([]))
    assert counts(conn) == (0, 0, 0)


def test_enqueue_many_streams_a_generator_of_30k_payloads(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    result = client.enqueue_many("t", ({"i": i} for i in range(30_000)))
    assert result.inserted == 30_000
    assert conn.execute(
        "SELECT count(*), count(DISTINCT id), min((payload->>'i')::int), max((payload->>'i')::int)"
        " FROM jobrun.jobs"
    ).fetchone() == (30_000, 30_000, 0, 29_999)


def test_enqueue_many_in_the_callers_transaction_exists_only_if_it_commits(
    client: Client, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(dsn) as caller:
        client.enqueue_many("t", [{"i": 1}, {"i": 2}], conn=caller)
        assert counts(conn) == (0, 0, 0)  # not yet committed
        caller.rollback()
    assert counts(conn) == (0, 0, 0)
    with psycopg.connect(dsn) as caller:
        client.enqueue_many("t", [{"i": 1}, {"i": 2}], conn=caller)
        caller.commit()
    assert counts(conn) == (2, 2, 0)


def test_jobs_like_refuses_a_template_with_an_idempotency_key() -> None:
    template = NewJob(type="t", idempotency_key="once")
    with pytest.raises(ValidationError) as raised:
        next(jobs_like(template, [{}]))
    assert raised.value.field == "idempotency_key"


def test_jobs_like_makes_jobs_equal_to_the_newjobs_they_stand_for() -> None:
    template = NewJob(type="t", queue="q", priority=3, concurrency_key="k")
    made = list(jobs_like(template, [{"a": (1, 2)}, {"b": "x"}]))
    for job, payload in zip(made, [{"a": [1, 2]}, {"b": "x"}], strict=True):
        same = NewJob(
            type="t", queue="q", priority=3, concurrency_key="k", payload=payload, id=job.id
        )
        assert job == same
        assert job.payload_json == same.payload_json


def test_store_enqueue_many_refuses_a_keyed_template_or_anything_but_a_newjob(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ValidationError) as raised:
        store.enqueue_many(NewJob(type="t", idempotency_key="once"), [{}])
    assert raised.value.field == "idempotency_key"
    with pytest.raises(ValidationError) as raised:
        store.enqueue_many({"type": "t"}, [{}])  # type: ignore[arg-type]
    assert raised.value.field == "template"
    assert counts(conn) == (0, 0, 0)


def test_store_enqueue_many_with_terminal_events_writes_no_enqueued_events(
    terminal_store: Store, conn: psycopg.Connection[Any]
) -> None:
    result = terminal_store.enqueue_many(NewJob(type="t"), ({"i": i} for i in range(7)))
    assert result.inserted == 7
    assert counts(conn) == (7, 0, 0)
