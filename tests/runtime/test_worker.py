"""The worker, in this process, against real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import jobrun
from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, Job, NewJob, State
from jobrun.postgres.notify import Notifier
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, PermanentFailure, Registry, Worker, WorkerConfig
from tests.runtime.conftest import FAST
from tests.support.waiting import wait_for

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)


def state_of(store: Store, job: Job) -> State:
    return store.get(job.id).state


def enqueue(store: Store, type: str = "t", **fields: Any) -> Job:
    fields.setdefault("backoff", NO_WAIT)
    return store.enqueue(NewJob(type=type, **fields))


def test_a_handler_returning_none_succeeds_through_a_batch(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    seen: list[dict[str, Any]] = []
    registry.register("t", lambda ctx, job: seen.append(job.payload))
    job = enqueue(store, payload={"n": 1})
    worker = make_worker()
    wait_for(lambda: state_of(store, job) is State.SUCCEEDED)
    assert seen == [{"n": 1}]
    assert store.effect_done(store.get(job.id))
    wait_for(lambda: worker.stats["succeeded"] == 1)


def test_a_commit_callable_writes_its_effect_exactly_once(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    conn.execute("CREATE TABLE side (job_id uuid PRIMARY KEY)")

    def handler(ctx: JobContext, job: Job) -> Callable[[psycopg.Connection[Any]], None]:
        return lambda c: c.execute("INSERT INTO side VALUES (%s)", [job.id])

    registry.register("t", handler)
    jobs = [enqueue(store) for _ in range(20)]
    make_worker(concurrency=4)
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in jobs))
    assert conn.execute("SELECT count(*) FROM side").fetchone() == (20,)


def test_a_raising_handler_fails_the_attempt_with_backoff_until_dead(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    attempts: list[int] = []

    def handler(ctx: JobContext, job: Job) -> None:
        attempts.append(ctx.attempt)
        raise RuntimeError("boom")

    registry.register("t", handler)
    job = enqueue(store, max_attempts=3)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    assert attempts == [1, 2, 3]
    stored = store.get(job.id)
    assert stored.last_error is not None and "RuntimeError: boom" in stored.last_error
    kinds = [str(e.kind) for e in store.events(job.id)]
    assert kinds.count("retrying") == 2 and kinds[-1] == "dead"


def test_failure_schedules_the_retry_by_the_jobs_backoff_on_the_database_clock(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        raise RuntimeError("later")

    registry.register("t", handler)
    job = enqueue(store, backoff=Backoff(kind="constant", base=600.0, jitter=0.0))
    make_worker()
    wait_for(lambda: store.get(job.id).attempts == 1 and state_of(store, job) is State.QUEUED)
    stored = store.get(job.id)
    assert stored.run_at - stored.updated_at == pytest.approx(
        dt.timedelta(seconds=600), abs=dt.timedelta(seconds=2)
    )


def test_a_permanent_failure_is_dead_at_once(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        raise PermanentFailure("bad input")

    registry.register("t", handler)
    job = enqueue(store, max_attempts=10)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    assert store.get(job.id).attempts == 1


def test_a_return_value_that_is_neither_none_nor_callable_is_the_jobs_result(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    registry.register("t", lambda ctx, job: 42)
    job = enqueue(store, max_attempts=1)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.SUCCEEDED)
    assert store.get(job.id).result == 42


def test_a_job_without_a_handler_is_released_without_burning_its_attempt(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    registry.register("known", lambda ctx, job: None)
    job = enqueue(
        store, type="unknown.type", backoff=Backoff(kind="constant", base=300.0, jitter=0.0)
    )
    make_worker()
    wait_for(lambda: [e.kind for e in store.events(job.id)][-1:] == ["released"])
    stored = store.get(job.id)
    assert stored.state is State.QUEUED and stored.attempts == 0
    assert "no handler for job type 'unknown.type'" in (stored.last_error or "")
    assert stored.run_at > store.now()


def test_a_failing_commit_callable_fails_the_attempt_and_writes_nothing(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    conn.execute("CREATE TABLE side (x int)")

    def commit(c: psycopg.Connection[Any]) -> None:
        c.execute("INSERT INTO side VALUES (1)")
        raise ValueError("constraint in my head")

    registry.register("t", lambda ctx, job: commit)
    job = enqueue(store, max_attempts=2)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    assert conn.execute("SELECT count(*) FROM side").fetchone() == (0,)
    assert "commit callable failed" in (store.get(job.id).last_error or "")


def test_a_handler_past_its_timeout_is_cancelled_and_the_attempt_fails(
    store: Store, make_worker: Callable[..., Worker]
) -> None:
    registry = Registry()
    seen: list[bool] = []

    def slow(ctx: JobContext, job: Job) -> None:
        seen.append(ctx.cancelled.wait(30))
        assert ctx.remaining() == 0.0

    registry.register("t", slow, timeout=dt.timedelta(milliseconds=300))
    worker = Worker(
        store,
        registry,
        WorkerConfig(
            lease_ttl=dt.timedelta(seconds=3),
            heartbeat_interval=dt.timedelta(milliseconds=500),
            poll_interval=dt.timedelta(milliseconds=200),
        ),
    )
    worker.start()
    try:
        job = enqueue(store, max_attempts=1)
        wait_for(lambda: state_of(store, job) is State.DEAD)
        assert seen == [True]
        assert "cancelled (timeout)" in (store.get(job.id).last_error or "")
    finally:
        worker.stop(5)


def test_cancelling_a_running_job_cancels_its_context_and_ends_it_cancelled(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    started = threading.Event()
    saw_cancel: list[bool] = []

    def handler(ctx: JobContext, job: Job) -> None:
        started.set()
        saw_cancel.append(ctx.cancelled.wait(30))

    registry.register("t", handler)
    job = enqueue(store)
    make_worker()
    assert started.wait(30)
    store.cancel(job.id)
    wait_for(lambda: state_of(store, job) is State.CANCELLED)
    assert saw_cancel == [True]


def test_the_worker_claims_only_as_many_jobs_as_it_has_free_threads(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    release = threading.Event()
    registry.register("t", lambda ctx, job: release.wait(30) and None)
    for _ in range(10):
        enqueue(store)
    make_worker(concurrency=2)

    def leased() -> int:
        return conn.execute("SELECT count(*) FROM jobrun.jobs WHERE state = 'leased'").fetchone()[0]

    wait_for(lambda: leased() == 2)
    time.sleep(0.6)  # a few claim-loop turns: still no more than 2
    assert leased() == 2
    release.set()
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM jobrun.jobs WHERE state = 'succeeded'").fetchone()[0]
            == 10
        )
    )


def test_per_queue_limits_hold_inside_one_worker(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    release = threading.Event()
    registry.register("t", lambda ctx, job: release.wait(30) and None)
    for _ in range(5):
        enqueue(store, queue="emails")
        enqueue(store, queue="default")
    make_worker(concurrency=8, queues={"emails": 1, "default": None})

    def leased(queue: str) -> int:
        return conn.execute(
            "SELECT count(*) FROM jobrun.jobs WHERE state = 'leased' AND queue = %s", [queue]
        ).fetchone()[0]

    wait_for(lambda: leased("default") == 5)
    time.sleep(0.6)
    assert leased("emails") == 1
    release.set()
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM jobrun.jobs WHERE state = 'succeeded'").fetchone()[0]
            == 10
        )
    )


def test_a_notification_wakes_an_idle_worker_long_before_its_poll_interval(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], notifier: Notifier
) -> None:
    done = threading.Event()
    registry.register("t", lambda ctx, job: done.set())
    assert notifier.wait_connected(10)
    make_worker(
        dispatcher=notifier,
        poll_interval=dt.timedelta(seconds=60),
        lease_ttl=dt.timedelta(seconds=300),
    )
    time.sleep(0.5)  # the worker has claimed nothing and waits
    enqueue(store)
    assert done.wait(30)  # the poll interval is a minute: only the notification can do this


def test_an_idle_worker_runs_a_delayed_job_when_it_is_due_not_at_its_next_poll(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], notifier: Notifier
) -> None:
    """The delayed job's notification carries its delay: the worker's wait ends
    when the job is due, although its poll interval is 30 s."""
    ran_at: list[float] = []
    done = threading.Event()

    def handler(ctx: JobContext, job: Job) -> None:
        ran_at.append(time.monotonic())
        done.set()

    registry.register("t", handler)
    assert notifier.wait_connected(10)
    make_worker(
        dispatcher=notifier,
        poll_interval=dt.timedelta(seconds=30),
        lease_ttl=dt.timedelta(seconds=300),
    )
    time.sleep(0.5)  # the worker has claimed nothing and waits
    before = time.monotonic()
    enqueue(store, delay=dt.timedelta(milliseconds=500))
    after = time.monotonic()
    assert done.wait(10)  # its next poll is 30 s away: only the carried delay can do this
    assert ran_at[0] - before >= 0.45  # never before it is due (the database's 500 ms)
    assert ran_at[0] - after < 0.5 + 1.0  # within a generous second of being due


def test_without_notifications_the_worker_polls(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    done = threading.Event()
    registry.register("t", lambda ctx, job: done.set())
    make_worker(dispatcher=None)
    time.sleep(0.3)
    enqueue(store)
    assert done.wait(30)


def test_graceful_stop_lets_running_jobs_finish_and_leaves_nothing_leased(
    store: Store, registry: Registry, conn: Any
) -> None:
    started = threading.Semaphore(0)

    def handler(ctx: JobContext, job: Job) -> None:
        started.release()
        time.sleep(0.5)

    registry.register("t", handler)
    jobs = [enqueue(store) for _ in range(3)]
    worker = Worker(
        store, registry, WorkerConfig(concurrency=3, lease_ttl=dt.timedelta(seconds=30))
    )
    worker.start()
    for _ in range(3):
        assert started.acquire(timeout=30)
    assert worker.stop(timeout=10)
    assert [state_of(store, j) for j in jobs] == [State.SUCCEEDED] * 3
    assert conn.execute("SELECT count(*) FROM jobrun.jobs WHERE state = 'leased'").fetchone() == (
        0,
    )


def test_a_worker_as_a_context_manager_is_started_inside_and_stopped_on_exit(
    store: Store, registry: Registry
) -> None:
    registry.register("t", lambda ctx, job: None)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    worker = Worker(store, registry, WorkerConfig(**FAST))
    with worker as entered:
        assert entered is worker
        job = enqueue(store)
        wait_for(lambda: state_of(store, job) is State.SUCCEEDED)
        assert all(t.is_alive() for t in [*worker._threads, *worker._handlers])
    assert not any(t.is_alive() for t in [*worker._threads, *worker._handlers])
    assert {s: signal.getsignal(s) for s in before} == before
    assert worker.stop(timeout=1) is True  # safe to call again


def test_run_without_signals_returns_once_stop_is_called_from_another_thread(
    store: Store, registry: Registry
) -> None:
    registry.register("t", lambda ctx, job: None)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    worker = Worker(store, registry, WorkerConfig(**FAST))
    returned = threading.Event()

    def run() -> None:
        worker.run(install_signals=False)
        returned.set()

    thread = threading.Thread(target=run, name="embedding-app", daemon=True)
    thread.start()
    try:
        job = enqueue(store)
        wait_for(lambda: state_of(store, job) is State.SUCCEEDED)
        assert not returned.is_set()
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        drained = worker.stop(timeout=5)
    assert drained is True
    thread.join(15)
    assert returned.is_set(), "run() did not return after stop()"
    # Handler threads end on their sentinel, a moment after stop() returns.
    wait_for(lambda: not any(t.is_alive() for t in [*worker._threads, *worker._handlers]), 10)


def test_run_with_signals_off_the_main_thread_says_how_to_embed_it(
    store: Store, registry: Registry
) -> None:
    worker = Worker(store, registry, WorkerConfig(**FAST))
    caught: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except RuntimeError as exc:
            caught.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert len(caught) == 1
    assert "install_signals=False" in str(caught[0])
    assert not worker._started


def test_a_grace_period_too_short_cancels_handlers_and_requeues_their_jobs(
    store: Store, registry: Registry
) -> None:
    started = threading.Event()

    def handler(ctx: JobContext, job: Job) -> None:
        started.set()
        ctx.cancelled.wait(60)

    registry.register("t", handler)
    job = enqueue(store)
    worker = Worker(store, registry, WorkerConfig(lease_ttl=dt.timedelta(seconds=30)))
    worker.start()
    assert started.wait(30)
    assert worker.stop(timeout=0.2)
    stored = store.get(job.id)
    assert stored.state is State.QUEUED
    assert "worker shutting down" in (stored.last_error or "")


def test_a_job_whose_handler_ignores_cancellation_at_stop_is_queued_again_at_once(
    store: Store, registry: Registry
) -> None:
    """Not leased to the stopping worker until its lease (30 s) expires: failed
    back to the queue as the worker stops, its attempt kept (it did run).
    (An abandoned coroutine takes the same path; it is left out here because
    it leaves its stopped event loop unclosed, by design.)"""
    started = threading.Event()
    release = threading.Event()

    def handler(ctx: JobContext, job: Job) -> None:
        started.set()
        release.wait(60)  # deaf to its cancel token

    registry.register("t", handler)
    job = enqueue(store)
    worker = Worker(store, registry, WorkerConfig(lease_ttl=dt.timedelta(seconds=30)))
    worker.start()
    try:
        assert started.wait(30)
        assert worker.stop(timeout=0.2) is False  # a handler was abandoned
        stored = store.get(job.id)
        assert stored.state is State.QUEUED
        assert stored.attempts == 1
        assert stored.lease_owner is None
        assert stored.run_at <= store.now()
        assert "ignored cancellation" in (stored.last_error or "")
        last = store.events(job.id)[-1]
        assert last.kind == "retrying"
        assert "ignored cancellation" in str(last.detail)
    finally:
        release.set()


def test_a_handler_exception_never_kills_a_thread(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        if job.payload.get("bad"):
            raise KeyError("nope")

    registry.register("t", handler)
    bad = [enqueue(store, payload={"bad": True}, max_attempts=1) for _ in range(10)]
    worker = make_worker(concurrency=2)
    wait_for(lambda: all(state_of(store, j) is State.DEAD for j in bad))
    good = enqueue(store)
    wait_for(lambda: state_of(store, good) is State.SUCCEEDED)
    assert all(t.is_alive() for t in worker._handlers)


def test_threads_are_named_and_owners_are_unique_per_start(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    a = make_worker(concurrency=2)
    b = make_worker(concurrency=1)
    assert a.owner != b.owner
    names = {t.name for t in threading.enumerate()}
    assert {"jobrun-claimer", "jobrun-completer", "jobrun-heartbeat", "jobrun-handler-0"} <= names


def test_jobs_waiting_for_their_batch_keep_being_heartbeated(
    store: Store, registry: Registry
) -> None:
    registry.register("t", lambda ctx, job: None)
    worker = Worker(
        store,
        registry,
        WorkerConfig(
            lease_ttl=dt.timedelta(seconds=30),
            heartbeat_interval=dt.timedelta(seconds=10),
            complete_batch_size=1000,
            complete_flush_interval=dt.timedelta(seconds=30),
        ),
    )
    job = enqueue(store)
    worker.start()
    try:
        wait_for(lambda: not worker.running_jobs and not worker.idle)  # handled, not flushed
        before = store.get(job.id).lease_expires_at
        assert before is not None
        time.sleep(0.05)
        worker.heartbeat_once()
        after = store.get(job.id).lease_expires_at
        assert after is not None and after > before
        assert state_of(store, job) is State.LEASED
    finally:
        worker.stop(10)
    assert state_of(store, job) is State.SUCCEEDED  # the stop flushed the batch


def test_a_job_reaped_while_its_handler_runs_is_not_finished_by_the_old_owner(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    started = threading.Event()
    proceed = threading.Event()

    def handler(ctx: JobContext, job: Job) -> Callable[[Any], None]:
        started.set()
        proceed.wait(30)
        return lambda c: c.execute("SELECT 1")

    registry.register("t", handler)
    job = enqueue(store, backoff=Backoff(kind="constant", base=3600.0, jitter=0.0))
    worker = make_worker(
        heartbeat_interval=dt.timedelta(seconds=1), lease_ttl=dt.timedelta(seconds=30)
    )
    assert started.wait(30)
    conn.execute(
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s", [job.id]
    )
    assert store.reap_expired(store.now(), 10).requeued == [job.id]
    proceed.set()
    wait_for(lambda: worker.stats["lease_lost"] >= 1)
    assert state_of(store, job) is State.QUEUED
    assert not store.effect_done(store.get(job.id))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"heartbeat_interval": dt.timedelta(seconds=20)}, "heartbeat_interval"),
        ({"lease_ttl": dt.timedelta(0)}, "lease_ttl"),
        ({"queues": "emails=0"}, "queues"),
        ({"queues": "emails=x"}, "queues"),
        ({"queues": "a,a"}, "queues"),
        ({"queues": ""}, "queues"),
        ({"queues": "Bad Queue"}, "queues"),
        ({"complete_batch_size": 0}, "complete_batch_size"),
    ],
)
def test_invalid_worker_configuration_fails_at_start(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        WorkerConfig(**fields)
    assert info.value.field == field


def test_a_slow_completer_bounds_the_leases_a_worker_holds(
    store: Store, registry: Registry, conn: Any
) -> None:
    """Handlers finish fast, commit callables are slow: claiming waits for the backlog."""
    conn.execute("CREATE TABLE side (job_id uuid)")

    def handler(ctx: JobContext, job: Job) -> Callable[[Any], None]:
        def commit(c: psycopg.Connection[Any]) -> None:
            time.sleep(0.01)
            c.execute("INSERT INTO side VALUES (%s)", [job.id])

        return commit

    registry.register("t", handler)
    store.enqueue_batch([NewJob(type="t") for _ in range(300)])
    worker = Worker(
        store,
        registry,
        WorkerConfig(concurrency=4, complete_batch_size=4, lease_ttl=dt.timedelta(seconds=30)),
    )
    worker.start()
    most = 0
    try:
        while (
            conn.execute("SELECT count(*) FROM jobrun.jobs WHERE state = 'succeeded'").fetchone()[0]
            < 300
        ):
            (leased,) = conn.execute(
                "SELECT count(*) FROM jobrun.jobs WHERE state = 'leased'"
            ).fetchone()
            most = max(most, leased)
            time.sleep(0.02)
    finally:
        worker.stop(30)
    assert most <= 2 * 4
    assert conn.execute("SELECT count(*) FROM side").fetchone() == (300,)


def _batching_worker(store: Store, registry: Registry) -> Worker:
    """A worker whose completion batches wait a minute (or the stop) to flush."""
    return Worker(
        store,
        registry,
        WorkerConfig(
            concurrency=4,
            lease_ttl=dt.timedelta(seconds=120),
            heartbeat_interval=dt.timedelta(seconds=10),
            complete_batch_size=1000,
            complete_flush_interval=dt.timedelta(seconds=60),
        ),
    )


def test_a_chain_link_is_recorded_at_once(store: Store, registry: Registry) -> None:
    # Its success releases the next link: it skips the batch window. (The
    # next link is on a queue the worker does not serve.)
    registry.register("t", lambda ctx, job: None)
    client = jobrun.Client(store)
    link = client.enqueue("t")
    client.enqueue("t", after=[link], queue="later")
    worker = _batching_worker(store, registry)
    worker.start()
    try:
        wait_for(lambda: store.get(link.id).state is State.SUCCEEDED, timeout=45)
    finally:
        worker.stop(10)


def test_the_parents_of_a_wide_fan_in_are_recorded_in_a_batch(
    store: Store, registry: Registry
) -> None:
    # Each waits with 11 others for a fan-in, more than the worker runs at
    # once: flushing each at once would cost a batch per parent for a
    # release that waits for the last of them.
    ran: list[Job] = []
    registry.register("t", lambda ctx, job: ran.append(job))
    client = jobrun.Client(store)
    parents = [client.enqueue("t") for _ in range(12)]
    client.enqueue("t", after=parents, queue="later")
    worker = _batching_worker(store, registry)
    worker.start()
    try:
        wait_for(lambda: len(ran) == 12)
        time.sleep(0.5)  # an eager flush would have recorded some by now
        assert {store.get(p.id).state for p in parents} == {State.LEASED}
    finally:
        worker.stop(10)
    assert {store.get(p.id).state for p in parents} == {State.SUCCEEDED}  # the stop flushed them


def test_an_idle_completer_ends_with_the_stop_whatever_its_batch_window(
    store: Store, registry: Registry
) -> None:
    # The stop's None used to open a batch window of its own when the
    # completer held nothing: a minute's window outlived the stop's wait.
    worker = _batching_worker(store, registry)
    worker.start()
    worker.stop(10)
    assert "jobrun-completer" not in {t.name for t in threading.enumerate()}


def test_a_stop_ends_every_claim_lane_whatever_the_poll_interval(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    # An idle second lane waits for work up to the poll interval: the stop
    # used to leave it waiting, and the join gave up on it.
    worker = make_worker(concurrency=10, poll_interval=dt.timedelta(seconds=60))
    assert worker.config.claim_lanes == 2
    time.sleep(0.3)  # both lanes idle
    worker.stop(2)
    assert not {"jobrun-claimer", "jobrun-claimer-2"} & {t.name for t in threading.enumerate()}
