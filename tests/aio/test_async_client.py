"""AsyncClient against a real PostgreSQL: enqueue, inspect, administer, wait.

Every test is a plain function driving its coroutines through ``aio`` (one
event loop for the test, see conftest.py). The database is the test's own
(tests/conftest.py); the sync Store and a real threaded Worker stand in for
the other side of the queue where a test needs one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest

import jobrun
from jobrun import AsyncClient, NewJob, Registry, Settings, State, Worker, WorkerConfig
from jobrun.job.errors import (
    IdempotencyConflict,
    InvalidState,
    NotFound,
    SchemaMismatch,
    TransientError,
    ValidationError,
    WaitTimeout,
)
from jobrun.postgres.async_store import AsyncStore
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, counts, new_job
from tests.runtime.conftest import FAST

Aio = Callable[[Awaitable[Any]], Any]


def listen(dsn: str, channel: str = "jobrun_jobs") -> psycopg.Connection[Any]:
    c = psycopg.connect(dsn, autocommit=True)
    c.execute(f"LISTEN {channel}")
    return c


def pending(c: psycopg.Connection[Any], wait: float = 0.3) -> list[str]:
    return [n.payload for n in c.notifies(timeout=wait)]


@pytest.fixture
def worker_registry() -> Registry:
    registry = Registry()

    @registry.handler("add")
    def add(ctx: Any, job: jobrun.Job) -> dict[str, int]:
        return {"sum": job.payload["a"] + job.payload["b"]}

    @registry.handler("slow")
    def slow(ctx: Any, job: jobrun.Job) -> str:
        time.sleep(job.payload["seconds"])
        return "slept"

    return registry


@pytest.fixture
def worker(store: Store, worker_registry: Registry) -> Iterator[Worker]:
    """A real threaded Worker on the sync Store, running the handlers above."""
    w = Worker(store, worker_registry, WorkerConfig(**FAST))
    w.start()
    try:
        yield w
    finally:
        w.stop(timeout=5)


# -- connect ---------------------------------------------------------------------------


def test_connect_checks_the_schema_and_close_closes_the_pool(aio: Aio, dsn: str) -> None:
    async def scenario() -> AsyncClient:
        async with await AsyncClient.connect(dsn) as client:
            assert (await client.now()).tzinfo is dt.UTC
        return client

    client = aio(scenario())
    assert client.store.pool.closed


def test_connect_to_an_unmigrated_database_raises_schema_mismatch(aio: Aio, empty_dsn: str) -> None:
    with pytest.raises(SchemaMismatch):
        aio(AsyncClient.connect(empty_dsn))


def test_connect_checks_the_schema_under_the_call_bound_not_a_tiny_database_timeout(
    aio: Aio, dsn: str, database: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute(f"ALTER DATABASE \"{database}\" SET statement_timeout = '50ms'")
    try:
        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE jobrun.schema_version IN ACCESS EXCLUSIVE MODE")

            async def scenario() -> float:
                started = time.monotonic()
                asyncio.get_running_loop().call_later(0.5, locker.rollback)
                client = await AsyncClient.connect(dsn)
                await client.close()
                return time.monotonic() - started

            assert aio(scenario()) >= 0.4  # it waited for the lock, past the 50 ms
    finally:
        conn.execute(f'ALTER DATABASE "{database}" RESET statement_timeout')


def test_connect_to_nothing_is_a_transient_error_without_the_password(aio: Aio) -> None:
    url = "postgresql://someone:s3cret@127.0.0.1:1/nodb?connect_timeout=2"
    with pytest.raises(TransientError) as info:
        aio(AsyncClient.connect(url))
    assert "s3cret" not in str(info.value)


def test_connect_takes_the_store_settings_from_settings(aio: Aio, dsn: str) -> None:
    settings = Settings(
        database_url=dsn,
        notify_channel="other_channel",
        job_events="terminal",
        call_timeout=dt.timedelta(seconds=3),
    )

    async def scenario() -> AsyncStore:
        async with await AsyncClient.connect(settings=settings) as client:
            with listen(dsn, "other_channel") as listener:
                job = await client.enqueue("t")
                assert pending(listener) == ["default"]
            assert await client.events(job.id) == []  # terminal: no "enqueued" row
            return client.store

    store = aio(scenario())
    assert (store.notify_channel, store.finish_channel) == ("other_channel", "other_channel_done")
    assert store.call_timeout == 3.0


def test_jobrun_asyncclient_is_the_asyncio_client_and_import_jobrun_does_not_load_it() -> None:
    assert jobrun.AsyncClient is AsyncClient
    assert "AsyncClient" in jobrun.__all__
    script = (
        "import sys, jobrun\n"
        "loaded = [m for m in ('jobrun.aio', 'jobrun.postgres.async_store',"
        " 'jobrun.postgres.sqlc.aio') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "assert jobrun.AsyncClient.__module__ == 'jobrun.aio'\n"
        "assert 'jobrun.postgres.sqlc.aio' in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


# -- enqueue ---------------------------------------------------------------------------


def test_enqueue_returns_the_stored_job_and_wakes_its_queue(
    aio: Aio, aclient: AsyncClient, store: Store, dsn: str
) -> None:
    with listen(dsn) as listener:
        job = aio(
            aclient.enqueue("email.send", {"to": "a@example.com"}, queue="emails", priority=3)
        )
        assert pending(listener) == ["emails"]
    assert job.state is State.QUEUED and job.attempts == 0
    assert (job.queue, job.type, job.priority) == ("emails", "email.send", 3)
    assert job.payload == {"to": "a@example.com"}
    assert job.id.version == 7
    assert job.run_at == job.created_at and job.created_at.tzinfo is dt.UTC
    assert store.get(job.id) == job
    assert [e.kind for e in aio(aclient.events(job.id))] == ["enqueued"]


def test_enqueue_takes_every_option_of_the_sync_client(aio: Aio, aclient: AsyncClient) -> None:
    job_id = uuid.uuid4()
    when = dt.datetime(2031, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    backoff = jobrun.Backoff(kind="linear", base=2.0)
    at = aio(
        aclient.enqueue(
            "t",
            {"list": [1, 2]},
            queue="q",
            priority=-4,
            max_attempts=7,
            backoff=backoff,
            run_at=when,
            idempotency_key="k",
            concurrency_key="tenant-1",
            id=job_id,
        )
    )
    assert (at.id, at.payload, at.priority, at.max_attempts, at.backoff) == (
        job_id,
        {"list": [1, 2]},
        -4,
        7,
        backoff,
    )
    assert (at.run_at, at.idempotency_key, at.concurrency_key) == (when, "k", "tenant-1")
    later = aio(aclient.enqueue("t", delay=dt.timedelta(minutes=5)))
    assert later.payload == {} and later.run_at - later.created_at == dt.timedelta(minutes=5)


def test_enqueue_batch_copies_unkeyed_jobs_and_inserts_keyed_ones_with_one_wakeup_per_queue(
    aio: Aio, aclient: AsyncClient, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    jobs = [new_job(queue="a") for _ in range(3)] + [new_job(queue="b", idempotency_key="k")]
    with listen(dsn) as listener:
        result = aio(aclient.enqueue_batch(iter(jobs)))
        assert sorted(pending(listener)) == ["a", "b"]
    assert (result.inserted, result.replayed) == (4, ())
    assert counts(conn) == (4, 4, 0)
    assert [j.id for j in aio(aclient.list(queue="a"))] == [j.id for j in jobs[:3]]


def test_delayed_jobs_enqueued_async_announce_the_time_left(
    aio: Aio, aclient: AsyncClient, dsn: str
) -> None:
    """As the sync Store: one enqueue notifies <queue>@<ms>, a batch its soonest per queue."""
    batch = [
        new_job(queue="a", delay=dt.timedelta(minutes=2)),
        new_job(queue="a", delay=dt.timedelta(minutes=1), idempotency_key="k"),
        new_job(queue="b"),
    ]
    with listen(dsn) as listener:
        aio(aclient.enqueue("t", queue="one", delay=dt.timedelta(seconds=30)))
        aio(aclient.enqueue_batch(batch))
        payloads = pending(listener)
    assert [p.split("@")[0] for p in payloads] == ["one", "a", "b"]
    one, a = (int(p.split("@")[1]) for p in payloads[:2])
    assert 20_000 < one <= 30_000
    assert 50_000 < a <= 60_000


def test_enqueue_batch_of_20k_jobs_from_a_generator(
    aio: Aio, aclient: AsyncClient, conn: psycopg.Connection[Any]
) -> None:
    result = aio(aclient.enqueue_batch(new_job(payload={"i": i}) for i in range(20_000)))
    assert result.inserted == 20_000
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (20_000,)


def test_enqueue_many_makes_one_job_per_payload_with_one_wakeup(
    aio: Aio, aclient: AsyncClient, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with listen(dsn) as listener:
        result = aio(aclient.enqueue_many("t", [{"i": i} for i in range(5)], queue="a", priority=2))
        assert pending(listener) == ["a"]
    assert (result.inserted, result.replayed) == (5, ())
    assert counts(conn) == (5, 5, 0)
    jobs = aio(aclient.list(queue="a"))
    assert sorted(j.payload["i"] for j in jobs) == [0, 1, 2, 3, 4]
    assert {(j.type, j.priority) for j in jobs} == {("t", 2)}


def test_enqueue_many_with_a_bad_payload_names_it_and_writes_nothing(
    aio: Aio, aclient: AsyncClient, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ValidationError) as raised:
        aio(aclient.enqueue_many("t", ({"i": i} if i != 7 else {"x": b"bytes"} for i in range(10))))
    assert raised.value.field == "payloads[7]"
    with pytest.raises(ValidationError, match="empty"):
        aio(aclient.enqueue_many("t", []))
    assert counts(conn) == (0, 0, 0)


def test_a_keyed_replay_returns_the_stored_job_and_a_different_body_conflicts(
    aio: Aio, aclient: AsyncClient, conn: psycopg.Connection[Any]
) -> None:
    first = aio(aclient.enqueue("t", {"a": 1, "b": [1, 2]}, idempotency_key="order-1"))
    again = aio(aclient.enqueue("t", {"b": [1, 2], "a": 1}, idempotency_key="order-1"))
    assert again == first
    with pytest.raises(IdempotencyConflict) as info:
        aio(aclient.enqueue("t", {"a": 2}, idempotency_key="order-1"))
    assert info.value.key == "order-1"
    result = aio(
        aclient.enqueue_batch(
            [new_job(type="t", payload={"a": 1, "b": [1, 2]}, idempotency_key="order-1")]
        )
    )
    assert result.inserted == 0 and [j.id for j in result.replayed] == [first.id]
    assert counts(conn) == (1, 1, 0)


def test_32_concurrent_enqueues_of_one_key_make_one_row_and_all_get_it(
    aio: Aio, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    async def scenario() -> list[jobrun.Job]:
        async with await AsyncClient.connect(dsn, pool_size=24) as client:
            return await asyncio.gather(
                *(client.enqueue("t", {"x": 1}, idempotency_key="storm") for _ in range(32))
            )

    jobs = aio(scenario())
    assert len({j.id for j in jobs}) == 1
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (1,)


# -- on the caller's async connection ----------------------------------------------------


def test_an_enqueue_in_the_callers_transaction_exists_and_wakes_only_once_it_commits(
    aio: Aio, aclient: AsyncClient, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    async def scenario(listener: psycopg.Connection[Any]) -> jobrun.Job:
        async with await psycopg.AsyncConnection.connect(dsn) as caller:
            async with caller.transaction():
                await caller.execute("CREATE TEMP TABLE orders (id int)")
                job = await aclient.enqueue("order.ship", {"order": 7}, conn=caller)
                await aclient.enqueue_batch([new_job(), new_job()], conn=caller)
                assert pending(listener) == []
                assert counts(conn) == (0, 0, 0)  # not visible before COMMIT
            assert pending(listener) == ["default"]
            return job

    with listen(dsn) as listener:
        job = aio(scenario(listener))
    assert counts(conn) == (3, 3, 0)
    assert aio(aclient.get(job.id)).state is State.QUEUED


def test_an_enqueue_in_the_callers_transaction_rolled_back_leaves_nothing(
    aio: Aio, aclient: AsyncClient, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    class Rollback(Exception):
        pass

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as caller:
            with pytest.raises(Rollback):
                async with caller.transaction():
                    await aclient.enqueue("t", conn=caller)
                    await aclient.enqueue_batch(
                        [new_job(), new_job(idempotency_key="k")], conn=caller
                    )
                    raise Rollback
            # No transaction block: the one psycopg opens with a first statement,
            # here the enqueue's own, is the caller's.
            await aclient.enqueue("t", conn=caller)
            await aclient.enqueue_batch([new_job(), new_job()], conn=caller)
            await caller.rollback()

    with listen(dsn) as listener:
        aio(scenario())
        assert pending(listener) == []
    assert counts(conn) == (0, 0, 0)


def test_a_first_enqueue_on_a_connection_not_in_autocommit_joins_the_callers_transaction(
    aio: Aio, aclient: AsyncClient, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    async def scenario() -> jobrun.Job:
        async with await psycopg.AsyncConnection.connect(dsn) as caller:
            job = await aclient.enqueue("t", conn=caller)
            assert counts(conn) == (0, 0, 0)  # the caller's, not committed yet
            await caller.commit()
            return job

    job = aio(scenario())
    assert aio(aclient.get(job.id)).state is State.QUEUED


def test_a_conflict_on_the_callers_connection_leaves_its_transaction_usable(
    aio: Aio, aclient: AsyncClient, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    aio(aclient.enqueue("t", {"a": 1}, idempotency_key="k"))

    async def scenario() -> None:
        async with (
            await psycopg.AsyncConnection.connect(dsn) as caller,
            caller.transaction(),
        ):
            await caller.execute("CREATE TEMP TABLE t (x int)")
            with pytest.raises(IdempotencyConflict):
                await aclient.enqueue("t", {"a": 2}, idempotency_key="k", conn=caller)
            await caller.execute("INSERT INTO t VALUES (1)")  # still usable
            await aclient.enqueue("t", {"other": True}, conn=caller)

    aio(scenario())
    assert counts(conn)[0] == 2


def test_an_enqueue_on_an_autocommit_connection_commits_its_own_transaction(
    aio: Aio, aclient: AsyncClient, dsn: str, store: Store
) -> None:
    async def scenario() -> jobrun.Job:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as caller:
            return await aclient.enqueue("t", conn=caller)

    job = aio(scenario())
    assert store.get(job.id).state is State.QUEUED


def test_an_enqueue_on_an_aborted_transaction_or_a_sync_connection_is_a_validation_error(
    aio: Aio, aclient: AsyncClient, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as caller:
            with pytest.raises(psycopg.errors.DivisionByZero):
                await caller.execute("SELECT 1/0")
            with pytest.raises(ValidationError, match="aborted"):
                await aclient.enqueue("t", conn=caller)
        with psycopg.connect(dsn) as sync_conn:
            with pytest.raises(ValidationError, match="AsyncConnection"):
                await aclient.enqueue("t", conn=sync_conn)  # type: ignore[arg-type]
            with pytest.raises(ValidationError, match="AsyncConnection"):
                await aclient.enqueue_batch([new_job()], conn=sync_conn)  # type: ignore[arg-type]

    aio(scenario())
    assert counts(conn) == (0, 0, 0)


# -- validation comes first ----------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda c: c.enqueue("", {}), id="empty-type"),
        pytest.param(lambda c: c.enqueue("t", queue="bad queue!"), id="queue-name"),
        pytest.param(lambda c: c.enqueue("t", {"x": float("nan")}), id="nan-payload"),
        pytest.param(lambda c: c.enqueue("t", priority=True), id="bool-priority"),
        pytest.param(
            lambda c: c.enqueue("t", run_at=dt.datetime(2030, 1, 1)),  # noqa: DTZ001
            id="naive-run-at",
        ),
        pytest.param(lambda c: c.enqueue_batch([]), id="empty-batch"),
        pytest.param(
            lambda c: c.enqueue_batch([new_job(idempotency_key="k"), new_job(idempotency_key="k")]),
            id="key-twice",
        ),
        pytest.param(lambda c: c.enqueue_job({"type": "t"}), id="not-a-new-job"),
        pytest.param(lambda c: c.get("not-a-uuid"), id="job-id"),
        pytest.param(lambda c: c.list(state="bogus"), id="list-state"),
        pytest.param(lambda c: c.list(limit=0), id="list-limit"),
        pytest.param(lambda c: c.wait(uuid.uuid4(), timeout=-1), id="wait-timeout"),
        pytest.param(lambda c: c.wait(uuid.uuid4(), poll_interval=0), id="wait-poll"),
    ],
)
def test_bad_arguments_are_validation_errors_before_any_sql(
    aio: Aio, aclient: AsyncClient, call: Callable[[AsyncClient], Awaitable[Any]]
) -> None:
    # The pool is closed: a call that reached for a connection would fail otherwise.
    aio(aclient.store.pool.close())
    with pytest.raises(ValidationError):
        aio(call(aclient))


# -- get, list, events, cancel, retry ---------------------------------------------------


def test_get_list_and_events(aio: Aio, aclient: AsyncClient) -> None:
    a = aio(aclient.enqueue("x.a", queue="one"))
    b = aio(aclient.enqueue("x.b", queue="one"))
    c = aio(aclient.enqueue("x.a", queue="two"))
    assert aio(aclient.get(str(a.id))) == a
    with pytest.raises(NotFound):
        aio(aclient.get(uuid.uuid4()))
    assert [j.id for j in aio(aclient.list())] == [a.id, b.id, c.id]
    assert [j.id for j in aio(aclient.list(queue="one"))] == [a.id, b.id]
    assert [j.id for j in aio(aclient.list(type="x.a"))] == [a.id, c.id]
    assert [j.id for j in aio(aclient.list(state="queued", limit=2))] == [a.id, b.id]
    assert [j.id for j in aio(aclient.list(after=str(b.id)))] == [c.id]
    assert aio(aclient.list(state=State.DEAD)) == []
    (event,) = aio(aclient.events(a.id))
    assert (event.kind, event.job_id, event.attempt) == ("enqueued", a.id, 0)


def test_cancel_ends_a_queued_job_and_asks_a_running_one_to_stop(
    aio: Aio, aclient: AsyncClient, store: Store
) -> None:
    queued = aio(aclient.enqueue("t", queue="q1"))
    done = aio(aclient.cancel(queued.id))
    assert done.state is State.CANCELLED and done.finished_at is not None
    assert aio(aclient.cancel(queued.id)) == done  # terminal: unchanged
    running = aio(aclient.enqueue("t", queue="q2"))
    (claimed,) = store.claim("w1", ["q2"], 1, TTL)
    asked = aio(aclient.cancel(running.id))
    assert asked.state is State.LEASED and asked.cancel_requested
    assert [e.kind for e in aio(aclient.events(running.id))] == [
        "enqueued",
        "claimed",
        "cancel_requested",
    ]
    store.complete(claimed)
    assert aio(aclient.get(running.id)).state is State.CANCELLED  # cancel wins
    with pytest.raises(NotFound):
        aio(aclient.cancel(uuid.uuid4()))


def test_retry_requeues_a_finished_job_and_refuses_a_leased_one(
    aio: Aio, aclient: AsyncClient, store: Store, dsn: str
) -> None:
    job = aio(aclient.enqueue("t", queue="q"))
    aio(aclient.cancel(job.id))
    with listen(dsn) as listener:
        again = aio(aclient.retry(job.id))
        assert pending(listener) == ["q"]
    assert again.state is State.QUEUED and again.attempts == 0
    assert [e.kind for e in aio(aclient.events(job.id))][-1] == "retried"
    store.claim("w1", ["q"], 1, TTL)
    with pytest.raises(InvalidState):
        aio(aclient.retry(job.id))
    with pytest.raises(NotFound):
        aio(aclient.retry(uuid.uuid4()))


# -- wait -------------------------------------------------------------------------------


def test_wait_returns_the_result_a_real_worker_produced(
    aio: Aio, aclient: AsyncClient, worker: Worker
) -> None:
    job = aio(aclient.enqueue("add", {"a": 2, "b": 3}))
    done = aio(aclient.wait(job.id, timeout=30))
    assert done.state is State.SUCCEEDED
    assert done.result == {"sum": 5}
    assert aio(aclient.wait(job.id, timeout=0)) == done  # finished: answered at once


def test_waits_run_concurrently_on_one_event_loop_woken_by_notifications(
    aio: Aio, aclient: AsyncClient, worker: Worker
) -> None:
    async def scenario() -> tuple[list[jobrun.Job], float]:
        jobs = [await aclient.enqueue("slow", {"seconds": 0.5}) for _ in range(4)]
        started = time.monotonic()
        # A poll interval far longer than the test: only the notifications wake them.
        done = await asyncio.gather(
            *(aclient.wait(j.id, timeout=30, poll_interval=60) for j in jobs)
        )
        return list(done), time.monotonic() - started

    done, elapsed = aio(scenario())
    assert [j.result for j in done] == ["slept"] * 4
    assert elapsed < 20


def test_wait_times_out_with_the_job_as_it_stood(aio: Aio, aclient: AsyncClient) -> None:
    job = aio(aclient.enqueue("nobody.runs.this"))
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        aio(aclient.wait(job.id, timeout=0.5, poll_interval=0.1))
    assert 0.4 < time.monotonic() - started < 10
    assert isinstance(info.value, TimeoutError)
    assert info.value.job.id == job.id and info.value.job.state is State.QUEUED
    with pytest.raises(NotFound):
        aio(aclient.wait(uuid.uuid4(), timeout=1))


def test_wait_sees_a_cancel_and_a_dead_end_too(aio: Aio, aclient: AsyncClient) -> None:
    async def scenario() -> jobrun.Job:
        job = await aclient.enqueue("nobody.runs.this")
        waiting = asyncio.ensure_future(aclient.wait(job.id, timeout=30, poll_interval=60))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await aclient.cancel(job.id)
        return await waiting

    assert aio(scenario()).state is State.CANCELLED


# -- the store's bounds and diagnostics --------------------------------------------------


def test_a_call_past_the_call_timeout_fails_as_a_connection_fault(
    aio: Aio, make_astore: Callable[..., AsyncStore], dsn: str
) -> None:
    astore = make_astore(call_timeout=dt.timedelta(milliseconds=500))
    job = aio(astore.enqueue(NewJob(type="t")))
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM jobrun.jobs WHERE id = %s FOR UPDATE", [job.id])
        started = time.monotonic()
        with pytest.raises(TransientError):
            aio(astore.cancel(job.id))  # waits on the row lock: cut by the watchdog
        assert time.monotonic() - started < 10
    assert aio(astore.cancel(job.id)).state is State.CANCELLED  # a fresh connection


def test_a_full_notification_queue_is_reported_naming_the_sessions_holding_it(
    aio: Aio, astore: AsyncStore, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(dsn, application_name="the-blocker") as blocker:
        blocker.execute("SELECT 1")  # idle in an open transaction

        async def scenario() -> None:
            astore._notified(0.9)
            astore._notified(0.95)  # within the interval: one warning only
            await astore.aclose()

        with caplog.at_level(logging.WARNING, logger="jobrun.postgres.async_store"):
            aio(scenario())
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "90% full" in warnings[0] and "the-blocker" in warnings[0]
