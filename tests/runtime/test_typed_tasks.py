"""Typed tasks: ``@registry.task`` on a function, enqueued with its own arguments.

Against real PostgreSQL. What mypy says about the same calls is
tests/typing/test_mypy.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import jobrun
import jobrun.testing
from jobrun.job.errors import ValidationError
from jobrun.job.model import Job, NewJob, State
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry, Worker
from tests.support.waiting import wait_for


def jobs_in(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone()
    assert row is not None
    return int(row[0])


# -- enqueueing ----------------------------------------------------------------------------


def test_enqueue_checks_the_arguments_against_the_signature_before_writing_anything(
    store: Store, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    @registry.task("email.send")
    def send_email(to: str, subject: str, *, urgent: bool = False) -> None: ...

    wrong: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
        (("a@b.c",), {}, "missing a required argument: 'subject'"),
        (("a@b.c", "hi", "extra"), {}, "too many positional arguments"),
        (("a@b.c",), {"subject": "hi", "cc": "x"}, "unexpected keyword argument 'cc'"),
        (("a@b.c", "hi"), {"to": "again"}, "multiple values for argument 'to'"),
        (("a@b.c", "hi", True), {}, "too many positional arguments"),  # urgent is keyword-only
    ]
    for args, kwargs, message in wrong:
        with pytest.raises(ValidationError, match=message) as caught:
            send_email.enqueue(store, *args, **kwargs)
        assert caught.value.field == "arguments"
        assert "send_email(to: str, subject: str, *, urgent: bool = False)" in str(caught.value)
    assert jobs_in(conn) == 0


def test_an_argument_that_is_not_json_is_refused_naming_it_before_writing_anything(
    store: Store, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    @registry.task("report.build")
    def build(month: str, when: Any = None, tags: Any = ()) -> None: ...

    with pytest.raises(ValidationError, match=r"argument 'when'.*datetime") as caught:
        build.enqueue(store, "2026-11", when=dt.datetime.now(dt.UTC))
    assert caught.value.field == "when"
    with pytest.raises(ValidationError, match=r"argument 'tags'.*set") as caught:
        build.enqueue(store, "2026-11", tags={"a", "b"})
    assert caught.value.field == "tags"
    assert jobs_in(conn) == 0


def test_the_payload_is_the_named_arguments_passed_with_the_tasks_job_options(
    store: Store, registry: Registry
) -> None:
    @registry.task("email.send", queue="emails", max_attempts=5, priority=3)
    def send_email(to: str, subject: str = "hello", *, urgent: bool = False) -> None: ...

    by_position = send_email.enqueue(store, "ada@example.com", "hi")
    by_keyword = send_email.enqueue(store, subject="hi", to="ada@example.com")
    defaults_left_out = send_email.enqueue(store, "grace@example.com", urgent=True)
    assert by_position.payload == {"to": "ada@example.com", "subject": "hi"}
    assert by_keyword.payload == by_position.payload
    assert defaults_left_out.payload == {"to": "grace@example.com", "urgent": True}
    for job in (by_position, by_keyword, defaults_left_out):
        assert (job.type, job.queue, job.max_attempts, job.priority) == (
            "email.send",
            "emails",
            5,
            3,
        )


def test_a_client_a_store_and_enqueue_batch_with_new_job_all_enqueue_the_same_job(
    store: Store, registry: Registry
) -> None:
    @registry.task("t")
    def task(n: int) -> int:
        return n

    client = jobrun.Client(store)
    through_client = task.enqueue(client, 1)
    through_store = task.enqueue(store, 2)
    batch = client.enqueue_batch([task.new_job(n) for n in (3, 4)])
    assert batch.inserted == 2
    assert [j.payload for j in (through_client, through_store)] == [{"n": 1}, {"n": 2}]
    stored = {j.payload["n"] for j in client.list(type="t")}
    assert stored == {1, 2, 3, 4}


def test_options_override_one_enqueue_and_leave_the_task_as_it_was(
    store: Store, registry: Registry
) -> None:
    @registry.task("t", queue="q1", priority=5)
    def task(n: int) -> None: ...

    configured = task.options(
        queue="q2",
        priority=-1,
        max_attempts=2,
        delay=dt.timedelta(hours=1),
        idempotency_key="only-once",
        concurrency_key="tenant-7",
    )
    job = configured.enqueue(store, 1)
    again = configured.enqueue(store, 1)  # the same key and body: the stored job
    assert again.id == job.id
    assert (job.queue, job.priority, job.max_attempts) == ("q2", -1, 2)
    assert (job.idempotency_key, job.concurrency_key) == ("only-once", "tenant-7")
    assert job.run_at - job.created_at == pytest.approx(
        dt.timedelta(hours=1), abs=dt.timedelta(seconds=5)
    )
    plain = task.enqueue(store, 2)
    assert (plain.queue, plain.priority, plain.idempotency_key) == ("q1", 5, None)
    when = store.now() + dt.timedelta(days=1)
    assert task.options(run_at=when).enqueue(store, 3).run_at == when


def test_bad_options_are_refused_when_they_are_given(registry: Registry) -> None:
    @registry.task("t")
    def task(n: int) -> None: ...

    with pytest.raises(ValidationError, match="priority"):
        task.options(priority=10**9)
    with pytest.raises(ValidationError, match="run_at or delay"):
        task.options(delay=dt.timedelta(seconds=1), run_at=dt.datetime.now(dt.UTC))
    with pytest.raises(ValidationError, match="queue"):
        task.options(queue="")
    with pytest.raises(ValidationError, match="queue"):
        registry.task("u", queue="no spaces allowed here")


def test_options_conn_enqueues_in_the_callers_transaction(
    store: Store, registry: Registry, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    @registry.task("t")
    def task(n: int) -> None: ...

    with psycopg.connect(dsn) as mine:
        with mine.transaction(force_rollback=True):
            task.options(conn=mine).enqueue(store, 1)
            assert jobs_in(conn) == 0  # not committed: invisible elsewhere
        assert jobs_in(conn) == 0  # rolled back with the caller's transaction
        with mine.transaction():
            job = task.options(conn=mine).enqueue(jobrun.Client(store), 2)
    assert store.get(job.id).payload == {"n": 2}


def test_the_task_is_still_the_plain_function(registry: Registry) -> None:
    @registry.task("t")
    def add(a: int, b: int = 1) -> int:
        """Adds."""
        return a + b

    assert add(2, b=3) == 5
    assert add.__name__ == "add" and add.__doc__ == "Adds."
    assert add.type == "t" and "t" in registry
    assert str(add.signature) == "(a: int, b: int = 1) -> int"


def test_a_task_type_registered_twice_is_refused(registry: Registry) -> None:
    @registry.task("t")
    def one() -> None: ...

    with pytest.raises(ValidationError, match="already registered"):

        @registry.task("t")
        def two() -> None: ...


def test_an_async_generator_is_refused_as_a_task(registry: Registry) -> None:
    with pytest.raises(ValidationError, match="async generator"):

        @registry.task("t")
        async def produce() -> Any:
            yield 1


# -- running -------------------------------------------------------------------------------


def test_a_worker_runs_the_typed_task_with_its_arguments_and_stores_what_it_returns(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    calls: list[tuple[str, str, bool]] = []

    @registry.task("email.send")
    def send_email(to: str, subject: str, *, urgent: bool = False) -> dict[str, Any]:
        calls.append((to, subject, urgent))
        return {"sent_to": to, "urgent": urgent}

    first = send_email.enqueue(store, "ada@example.com", "hi")
    second = send_email.enqueue(store, subject="yo", to="grace@example.com", urgent=True)
    make_worker()
    wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in (first, second)))
    assert sorted(calls) == [("ada@example.com", "hi", False), ("grace@example.com", "yo", True)]
    assert store.get(first.id).result == {"sent_to": "ada@example.com", "urgent": False}
    assert store.get(second.id).result == {"sent_to": "grace@example.com", "urgent": True}


def test_a_typed_async_task_runs_on_the_event_loop_with_its_arguments(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    threads: list[str] = []

    @registry.task("fetch", timeout=dt.timedelta(seconds=30))
    async def fetch(url: str, retries: int = 0) -> str:
        threads.append(threading.current_thread().name)
        await asyncio.sleep(0.01)
        return f"{url} ({retries})"

    job = fetch.enqueue(store, "https://example.com", retries=2)
    make_worker()
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)
    assert store.get(job.id).result == "https://example.com (2)"
    assert threads == ["jobrun-async-loop"]
    registration = registry.get("fetch")
    assert registration is not None and registration.is_async
    assert registration.timeout == dt.timedelta(seconds=30)


def test_a_task_whose_first_parameter_is_the_context_gets_it_and_enqueue_leaves_it_out(
    store: Store, registry: Registry
) -> None:
    seen: list[tuple[str, int, int]] = []

    @registry.task("video.encode")
    def encode(ctx: jobrun.JobContext, video_id: int, *, chunks: int = 1) -> None:
        seen.append((str(ctx.job.id), ctx.attempt, video_id * chunks))

    @registry.task("video.async")
    async def encode_async(ctx: JobContext, video_id: int) -> int:
        await asyncio.sleep(0)
        return video_id + ctx.attempt

    job = encode.enqueue(store, 7, chunks=3)
    other = encode_async.enqueue(store, 10)
    assert job.payload == {"video_id": 7, "chunks": 3}
    assert str(encode.signature) == "(video_id: int, *, chunks: int = 1) -> None"
    report = jobrun.testing.run_jobs(store, registry)
    assert report.succeeded == 2
    assert seen == [(str(job.id), 1, 21)]
    assert store.get(other.id).result == 11


def test_star_args_and_star_kwargs_travel_under_their_names_and_come_back_as_given(
    store: Store, registry: Registry
) -> None:
    calls: list[tuple[Any, ...]] = []

    @registry.task("t")
    def everything(a: int, /, b: int = 2, *rest: int, c: str, **extra: Any) -> None:
        calls.append((a, b, rest, c, extra))

    job = everything.enqueue(store, 1, 5, 6, 7, c="x", flag=True)
    assert job.payload == {"a": 1, "b": 5, "rest": [6, 7], "c": "x", "extra": {"flag": True}}
    short = everything.enqueue(store, 1, c="y")
    assert short.payload == {"a": 1, "c": "y"}
    jobrun.testing.run_jobs(store, registry)
    assert sorted(calls) == [(1, 2, (), "y", {}), (1, 5, (6, 7), "x", {"flag": True})]


def test_a_payload_that_no_longer_fits_the_signature_fails_the_attempt_saying_why(
    store: Store, registry: Registry
) -> None:
    @registry.task("t")
    def task(to: str, subject: str) -> None: ...

    # Queued by other code (an older version, a raw client.enqueue): it misses one.
    job = store.enqueue(NewJob(type="t", payload={"to": "a@b.c", "cc": "x"}, max_attempts=1))
    jobrun.testing.run_jobs(store, registry)
    stored = store.get(job.id)
    assert stored.state is State.DEAD
    assert "does not fit task(to: str, subject: str)" in (stored.last_error or "")
    assert "unexpected argument(s) 'cc'" in (stored.last_error or "")


def test_aenqueue_enqueues_through_the_async_client_and_in_its_transaction(
    dsn: str, store: Store, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    @registry.task("t")
    def task(n: int) -> None: ...

    async def main() -> Job:
        async with await jobrun.AsyncClient.connect(dsn) as aclient:
            job = await task.options(priority=4).aenqueue(aclient, 9)
            async with (
                await psycopg.AsyncConnection.connect(dsn) as mine,
                mine.transaction(force_rollback=True),
            ):
                await task.options(conn=mine).aenqueue(aclient, 10)
            return job

    job = asyncio.run(main())
    stored = store.get(job.id)
    assert (stored.payload, stored.priority) == ({"n": 9}, 4)
    assert jobs_in(conn) == 1  # the one in the rolled-back transaction is gone with it


def test_enqueue_refuses_an_async_client_and_says_to_await_aenqueue(
    dsn: str, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    @registry.task("t")
    def task(n: int) -> None: ...

    async def main() -> None:
        async with await jobrun.AsyncClient.connect(dsn) as aclient:
            with pytest.raises(ValidationError, match=r"await task\.aenqueue"):
                task.enqueue(aclient, 1)  # type: ignore[arg-type]

    asyncio.run(main())
    assert jobs_in(conn) == 0


def test_the_handler_api_stays_beside_typed_tasks(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    @registry.handler("plain")
    def plain(ctx: JobContext, job: Job) -> str:
        return f"plain {job.payload['n']}"

    @registry.task("typed")
    def typed(n: int) -> str:
        return f"typed {n}"

    a = store.enqueue(NewJob(type="plain", payload={"n": 1}))
    b = typed.enqueue(store, 2)
    make_worker()
    wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in (a, b)))
    assert [store.get(j.id).result for j in (a, b)] == ["plain 1", "typed 2"]
