"""One set of enqueue behaviours, run on the sync Store and on the AsyncStore.

The idempotency rules (replays, conflicts, a client id taken, batches
retried after a lost COMMIT reply, payloads compared as jsonb) are the
subtle part of enqueue: each test here runs twice, once on the sync Store
and once on the AsyncStore driven through :class:`Driven` (every call run to
its end on the test's event loop), and both must answer alike.
tests/postgres/test_store_enqueue.py holds the sync Store's full suite.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import AlreadyExists, DatabaseError, IdempotencyConflict, ValidationError
from jobrun.job.model import Backoff, BatchResult, Event, Job, NewJob, State
from jobrun.postgres.async_store import AsyncStore
from jobrun.postgres.events import EventMode
from tests.postgres.conftest import counts, new_job
from tests.postgres.test_store_enqueue import SAME_AS_JSONB


class Driven:
    """An AsyncStore with the sync Store's methods: each call awaited on ``run``'s loop."""

    def __init__(self, store: AsyncStore, run: Callable[[Awaitable[Any]], Any]) -> None:
        self.store = store
        self.run = run

    def enqueue(self, job: NewJob) -> Job:
        result: Job = self.run(self.store.enqueue(job))
        return result

    def enqueue_batch(self, jobs: Iterable[NewJob]) -> BatchResult:
        result: BatchResult = self.run(self.store.enqueue_batch(jobs))
        return result

    def get(self, job_id: Any) -> Job:
        result: Job = self.run(self.store.get(job_id))
        return result

    def events(self, job_id: Any) -> list[Event]:
        result: list[Event] = self.run(self.store.events(job_id))
        return result

    def cancel(self, job_id: Any) -> Job:
        result: Job = self.run(self.store.cancel(job_id))
        return result


@pytest.fixture(params=["sync", "async"])
def make(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``make(**options)``: a Store, or an AsyncStore driven like one."""
    if request.param == "sync":
        sync_factory: Callable[..., Any] = request.getfixturevalue("make_store")
        return sync_factory
    async_factory: Callable[..., AsyncStore] = request.getfixturevalue("make_astore")
    run: Callable[[Awaitable[Any]], Any] = request.getfixturevalue("aio")
    return lambda **options: Driven(async_factory(**options), run)


@pytest.fixture
def either(make: Callable[..., Any]) -> Any:
    return make()


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"payload": {"b": [1, 2.5, None], "a": {"x": "é"}}, "priority": -3, "max_attempts": 2},
        {"queue": "q", "backoff": Backoff(kind="linear", base=2.0, jitter=0.5)},
        {"delay": dt.timedelta(minutes=3)},
        {"run_at": dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)},
        {"idempotency_key": "k-1", "concurrency_key": "tenant"},
        {"trace_context": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}},
    ],
    ids=["defaults", "payload", "queue", "delay", "run_at", "keys", "trace"],
)
def test_the_job_an_enqueue_returns_is_the_job_stored(either: Any, fields: dict[str, Any]) -> None:
    # The enqueue reads back only what the database decided (run_at,
    # created_at, updated_at): everything else it fills in must match the row.
    returned = either.enqueue(new_job(**fields))
    assert returned == either.get(returned.id)


def test_a_replay_with_the_same_body_returns_the_stored_job_and_writes_nothing(
    either: Any, conn: psycopg.Connection[Any]
) -> None:
    first = either.enqueue(new_job(idempotency_key="order-1", payload={"a": 1, "b": [1, 2]}))
    again = either.enqueue(new_job(idempotency_key="order-1", payload={"b": [1, 2], "a": 1}))
    assert again == first == either.get(first.id)
    assert counts(conn) == (1, 1, 0)


@pytest.mark.parametrize(
    "change",
    [
        {"type": "other.type"},
        {"payload": {"a": 2}},
        {"payload": {"a": True}},
        {"priority": 5},
        {"max_attempts": 3},
        {"backoff": Backoff(base=9.0)},
        {"concurrency_key": "tenant"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_replay_with_a_different_body_is_an_idempotency_conflict(
    either: Any, change: dict[str, Any]
) -> None:
    stored = either.enqueue(new_job(idempotency_key="order-7", payload={"a": 1}))
    body: dict[str, Any] = {"idempotency_key": "order-7", "payload": {"a": 1}, **change}
    with pytest.raises(IdempotencyConflict) as info:
        either.enqueue(new_job(**body))
    assert (info.value.key, info.value.queue) == ("order-7", "default")
    with pytest.raises(IdempotencyConflict):
        either.enqueue_batch([new_job(), new_job(**body)])
    assert [j.id for j in [either.get(stored.id)]] == [stored.id]


def test_a_key_is_per_queue_and_stays_taken_after_its_job_finished(either: Any) -> None:
    a = either.enqueue(new_job(idempotency_key="k", queue="a"))
    b = either.enqueue(new_job(idempotency_key="k", queue="b"))
    assert a.id != b.id
    either.cancel(a.id)
    again = either.enqueue(new_job(idempotency_key="k", queue="a"))
    assert again.id == a.id and again.state is State.CANCELLED


def test_an_enqueue_retried_with_the_same_id_is_a_replay_and_another_job_with_it_a_clash(
    either: Any,
) -> None:
    spec = new_job(payload={"a": 1})
    first = either.enqueue(spec)
    assert either.enqueue(spec) == first
    assert len(either.events(first.id)) == 1
    with pytest.raises(AlreadyExists):
        either.enqueue(new_job(payload={"a": 2}, id=spec.id))
    with pytest.raises(AlreadyExists):
        either.enqueue(new_job(payload={"a": 1}, id=spec.id, idempotency_key="other"))


def test_a_batch_replays_stored_keys_and_ids_and_inserts_the_rest(
    either: Any, conn: psycopg.Connection[Any]
) -> None:
    stored = either.enqueue(new_job(idempotency_key="k1", payload={"a": 1}))
    plain = [new_job(payload={"i": i}) for i in range(6)]
    either.enqueue_batch(plain[:3])
    result = either.enqueue_batch(
        [new_job(idempotency_key="k1", payload={"a": 1}), new_job(idempotency_key="k2"), *plain]
    )
    assert result.inserted == 4
    assert sorted(j.id for j in result.replayed) == sorted([stored.id, *(j.id for j in plain[:3])])
    assert counts(conn) == (8, 8, 0)


def test_a_batch_with_a_conflict_or_a_clash_writes_nothing(
    either: Any, conn: psycopg.Connection[Any]
) -> None:
    stored = either.enqueue(new_job(idempotency_key="k1", payload={"a": 1}))
    before = counts(conn)
    with pytest.raises(IdempotencyConflict):
        either.enqueue_batch(
            [new_job() for _ in range(10)]
            + [new_job(idempotency_key="k1", payload={"a": 2}), new_job(idempotency_key="k9")]
        )
    with pytest.raises(AlreadyExists):
        either.enqueue_batch([new_job(), new_job(payload={"a": 2}, id=stored.id), new_job()])
    with pytest.raises(AlreadyExists):
        either.enqueue_batch([new_job(idempotency_key="k", id=stored.id)])
    assert counts(conn) == before


def test_a_batch_refuses_a_key_twice_nothing_and_foreign_items_before_writing(
    either: Any, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ValidationError, match="twice"):
        either.enqueue_batch([new_job(idempotency_key="k"), new_job(idempotency_key="k")])
    with pytest.raises(ValidationError, match="twice"):
        either.enqueue_batch(
            new_job(idempotency_key="k" if i in (3, 7) else None) for i in range(10)
        )
    with pytest.raises(ValidationError, match="empty"):
        either.enqueue_batch(iter([]))
    with pytest.raises(ValidationError):
        either.enqueue_batch(iter([new_job(), "nope"]))
    with pytest.raises(ValidationError):
        either.enqueue({"type": "x"})
    assert counts(conn) == (0, 0, 0)


@pytest.mark.parametrize("payload", SAME_AS_JSONB)
def test_an_identical_replay_of_a_numeric_edge_case_is_never_a_conflict(
    either: Any, payload: dict[str, Any]
) -> None:
    first = either.enqueue(new_job(payload=payload, idempotency_key="k"))
    assert either.enqueue(new_job(payload=payload, idempotency_key="k")).id == first.id
    result = either.enqueue_batch([new_job(payload=payload, idempotency_key="k")])
    assert result.inserted == 0 and [j.id for j in result.replayed] == [first.id]
    batch = [new_job(payload=payload)]
    either.enqueue_batch(batch)
    assert [j.id for j in either.enqueue_batch(batch).replayed] == [batch[0].id]


@pytest.mark.parametrize(
    ("sent", "replayed", "same"),
    [
        pytest.param({"n": 1}, {"n": 1.0}, True, id="1-vs-1.0"),
        pytest.param({"n": 10**20}, {"n": 1e20}, True, id="10**20-vs-1e20"),
        pytest.param({"a": 1, "b": 2}, {"b": 2, "a": 1}, True, id="key-order"),
        pytest.param({"n": 1e16}, {"n": 1e16 + 2}, False, id="1e16-vs-1e16+2"),
        pytest.param({"n": 1}, {"n": "1"}, False, id="number-vs-string"),
        pytest.param({"n": [1, 2]}, {"n": [2, 1]}, False, id="array-order"),
    ],
)
def test_payloads_are_compared_as_jsonb(
    either: Any, sent: dict[str, Any], replayed: dict[str, Any], same: bool
) -> None:
    first = either.enqueue(new_job(payload=sent, idempotency_key="k"))
    if same:
        assert either.enqueue(new_job(payload=replayed, idempotency_key="k")).id == first.id
        assert either.enqueue_batch([new_job(payload=replayed, idempotency_key="k")]).replayed
    else:
        with pytest.raises(IdempotencyConflict):
            either.enqueue(new_job(payload=replayed, idempotency_key="k"))
        with pytest.raises(IdempotencyConflict):
            either.enqueue_batch([new_job(payload=replayed, idempotency_key="k")])


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_an_unknown_unique_index_is_an_error_naming_it_never_a_silent_replay(
    either: Any, conn: psycopg.Connection[Any], keyed: bool
) -> None:
    conn.execute(
        "CREATE UNIQUE INDEX jobs_one_per_type ON jobrun.jobs (type) WHERE type = 'only.one'"
    )
    either.enqueue(new_job(type="only.one", **({"idempotency_key": "k1"} if keyed else {})))
    before = counts(conn)
    other = {"idempotency_key": "k2"} if keyed else {}
    with pytest.raises(DatabaseError, match="jobs_one_per_type"):
        either.enqueue(new_job(type="only.one", **other))
    with pytest.raises(DatabaseError, match="jobs_one_per_type"):
        either.enqueue_batch([new_job(type="only.one", **other)])
    assert counts(conn) == before


def test_the_terminal_event_mode_writes_no_enqueued_events(
    make: Callable[..., Any], conn: psycopg.Connection[Any]
) -> None:
    store = make(event_mode=EventMode.TERMINAL)
    store.enqueue(new_job())
    store.enqueue_batch([new_job(), new_job(idempotency_key="k")])
    assert counts(conn) == (3, 0, 0)
