"""``async def`` handlers: one event loop per worker, the same leases, limits and outcomes.

In this process against real PostgreSQL, like test_worker.py and
test_worker_outcomes.py for plain handlers. Each test waits for conditions
with generous deadlines; none asserts speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import jobrun
import jobrun.testing
from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, EventKind, Job, NewJob, State
from jobrun.observe.tracing import Tracing
from jobrun.postgres.store import Store
from jobrun.worker import Done, JobContext, PermanentFailure, Registry, Snooze, Worker
from jobrun.worker.hooks import JobOutcome, WorkerHooks
from jobrun.worker.worker import ASYNC_IO_THREADS
from tests.runtime.conftest import FAST
from tests.support.waiting import wait_for

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)


def enqueue(store: Store, type: str = "t", **fields: Any) -> Job:
    fields.setdefault("backoff", NO_WAIT)
    return store.enqueue(NewJob(type=type, **fields))


def state_of(store: Store, job: Job) -> State:
    return store.get(job.id).state


def count(conn: psycopg.Connection[Any], where: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM jobrun.jobs WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


class Gauge:
    """How many handlers run at once, and the most that ever did."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.ran = 0

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.ran += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


def jobrun_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("jobrun-")}


# -- registration ------------------------------------------------------------------------


async def _async_handler(ctx: JobContext, job: Job) -> None:
    return None


class _AsyncCallable:
    async def __call__(self, ctx: JobContext, job: Job) -> None:
        return None


@pytest.mark.parametrize(
    "handler",
    [_async_handler, functools.partial(_async_handler), _AsyncCallable()],
    ids=["async-def", "partial-of-async-def", "object-with-async-call"],
)
def test_an_async_handler_is_registered_as_one_the_event_loop_runs(handler: Any) -> None:
    registry = Registry()
    registry.register("t", handler)
    registration = registry.get("t")
    assert registration is not None and registration.is_async
    assert registry.has_async


def test_an_async_generator_handler_is_refused_at_registration_saying_why() -> None:
    async def produce(ctx: JobContext, job: Job) -> Any:
        yield 1

    registry = Registry()
    with pytest.raises(ValidationError, match="async generator") as caught:
        registry.register("t", produce)
    assert caught.value.field == "handler"
    assert "t" not in registry


def test_a_registry_of_plain_handlers_has_no_async_side() -> None:
    registry = Registry()
    registry.register("t", lambda ctx, job: None)
    assert not registry.has_async
    registration = registry.get("t")
    assert registration is not None and not registration.is_async


# -- concurrency -------------------------------------------------------------------------


def test_200_sleeping_async_jobs_run_100_at_a_time_on_one_loop_without_a_thread_each(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    gauge = Gauge()
    loop_threads: set[str] = set()

    @registry.handler("t")
    async def nap(ctx: JobContext, job: Job) -> None:
        loop_threads.add(threading.current_thread().name)
        gauge.enter()
        try:
            await asyncio.sleep(0.2)
        finally:
            gauge.leave()

    before = jobrun_threads()
    store.enqueue_batch([NewJob(type="t", backoff=NO_WAIT) for _ in range(200)])
    worker = make_worker(concurrency=100)
    wait_for(lambda: worker.stats["succeeded"] == 200, 120)
    started = jobrun_threads() - before
    names = sorted(t.name for t in started)
    assert worker._handlers == []  # no handler thread at all: only async handlers
    assert not any(name.startswith("jobrun-handler-") for name in names), names
    assert len(started) <= 6 + ASYNC_IO_THREADS, names
    assert loop_threads == {"jobrun-async-loop"}
    assert gauge.ran == 200
    assert 1 < gauge.most <= 100  # many at once, never more than the concurrency


def test_sync_and_async_handlers_in_one_worker_share_its_concurrency(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    gauge = Gauge()
    release = threading.Event()

    @registry.handler("sync")
    def plain(ctx: JobContext, job: Job) -> None:
        gauge.enter()
        try:
            release.wait(30)
        finally:
            gauge.leave()

    @registry.handler("async")
    async def coroutine(ctx: JobContext, job: Job) -> None:
        gauge.enter()
        try:
            while not release.is_set():
                await asyncio.sleep(0.01)
        finally:
            gauge.leave()

    jobs = [enqueue(store, type="sync" if n % 2 else "async") for n in range(20)]
    worker = make_worker(concurrency=6)
    wait_for(lambda: gauge.now == 6)
    time.sleep(0.6)  # a few claim-loop turns: still no more than 6 leased or running
    assert count(conn, "state = 'leased'") == 6
    assert gauge.most == 6
    release.set()
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in jobs), 60)
    assert gauge.most <= 6
    assert 0 < len(worker._handlers) <= 6  # plain jobs started threads as they needed them


def test_per_queue_limits_count_async_jobs_too(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    release = asyncio.Event()
    loop_box: list[asyncio.AbstractEventLoop] = []

    @registry.handler("t")
    async def hold(ctx: JobContext, job: Job) -> None:
        loop_box[:] = [asyncio.get_running_loop()]
        await release.wait()

    for _ in range(5):
        enqueue(store, queue="emails")
        enqueue(store, queue="default")
    make_worker(concurrency=8, queues={"emails": 1, "default": None})
    wait_for(lambda: count(conn, "state = 'leased' AND queue = 'default'") == 5)
    time.sleep(0.6)
    assert count(conn, "state = 'leased' AND queue = 'emails'") == 1
    loop_box[0].call_soon_threadsafe(release.set)
    wait_for(lambda: count(conn, "state = 'succeeded'") == 10, 60)


# -- outcomes ----------------------------------------------------------------------------


def test_an_async_handlers_return_value_is_stored_as_the_jobs_result(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    @registry.handler("t")
    async def give(ctx: JobContext, job: Job) -> Any:
        await asyncio.sleep(0)
        return job.payload["give"]

    values: list[Any] = [{"sent": 3, "to": ["a@b.c"]}, [1, 2], "done", 0, False]
    jobs = [enqueue(store, payload={"give": v}) for v in values]
    make_worker(concurrency=4)
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in jobs))
    assert [store.get(j.id).result for j in jobs] == values


def test_an_async_handlers_commit_callable_writes_its_effect_exactly_once(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute("CREATE TABLE side (key text)")
    runs: list[str] = []

    @registry.handler("t")
    async def record(ctx: JobContext, job: Job) -> Done:
        runs.append(job.payload["key"])
        await asyncio.sleep(0.01)

        def commit(c: psycopg.Connection[Any]) -> None:  # a plain def, on the completer
            c.execute("INSERT INTO side VALUES (%s)", [job.payload["key"]])

        return Done(result={"ok": True}, commit=commit)

    first = enqueue(store, payload={"key": "k1"}, idempotency_key="k1")
    make_worker()
    wait_for(lambda: state_of(store, first) is State.SUCCEEDED)
    # The same effect again (a job re-run): its handler runs, its effect does not.
    store.retry(first.id)
    wait_for(lambda: len(runs) == 2 and state_of(store, first) is State.SUCCEEDED)
    assert conn.execute("SELECT key FROM side").fetchall() == [("k1",)]
    assert store.get(first.id).result == {"ok": True}


def test_an_async_handler_raising_fails_the_attempt_with_its_traceback(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    @registry.handler("t")
    async def broken(ctx: JobContext, job: Job) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("upstream said no")

    job = enqueue(store, max_attempts=2)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    stored = store.get(job.id)
    assert stored.attempts == 2
    assert "RuntimeError: upstream said no" in (stored.last_error or "")
    assert "in broken" in (stored.last_error or "")  # the coroutine's own frame


def test_permanent_failure_from_a_coroutine_makes_the_job_dead_at_once(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    @registry.handler("t")
    async def refuse(ctx: JobContext, job: Job) -> None:
        raise PermanentFailure("a negative invoice")

    job = enqueue(store, max_attempts=5)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    stored = store.get(job.id)
    assert stored.attempts == 1
    assert "a negative invoice" in (stored.last_error or "")


def test_snooze_raised_from_a_coroutine_requeues_the_job_with_its_attempt_given_back(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    @registry.handler("t")
    async def later(ctx: JobContext, job: Job) -> None:
        await asyncio.sleep(0)
        raise Snooze(dt.timedelta(minutes=10))

    job = enqueue(store)
    worker = make_worker()
    wait_for(lambda: worker.stats["snoozed"] == 1)
    stored = store.get(job.id)
    assert stored.state is State.QUEUED
    assert stored.attempts == 0 and stored.snoozes == 1
    assert stored.run_at - stored.updated_at == pytest.approx(
        dt.timedelta(minutes=10), abs=dt.timedelta(seconds=5)
    )
    assert store.events(job.id)[-1].kind is EventKind.SNOOZED


def test_snooze_returned_from_a_coroutine_counts_against_max_snoozes(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    async def later(ctx: JobContext, job: Job) -> Snooze:
        return Snooze(0.05)

    registry.register("t", later, max_snoozes=2)
    job = enqueue(store, max_attempts=1)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    stored = store.get(job.id)
    assert stored.snoozes == 2
    assert "snoozed more than 2 times" in (stored.last_error or "")


def test_an_async_handler_returning_an_unawaited_coroutine_is_dead_saying_so(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    @registry.handler("t")
    async def forgot(ctx: JobContext, job: Job) -> Any:
        return asyncio.sleep(1)

    job = enqueue(store, max_attempts=5)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    stored = store.get(job.id)
    assert stored.attempts == 1
    assert "returned a coroutine" in (stored.last_error or "")
    assert "await" in (stored.last_error or "")


# -- cancellation and timeouts -------------------------------------------------------------


def test_an_async_job_past_its_timeout_has_its_task_cancelled_and_the_attempt_fails(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    seen: list[str] = []

    async def slow(ctx: JobContext, job: Job) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append(f"cancelled: {ctx.cancel_reason}")
            raise

    registry.register("t", slow, timeout=dt.timedelta(milliseconds=300))
    job = enqueue(store, max_attempts=1)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    assert seen == ["cancelled: timeout"]
    assert "cancelled (timeout)" in (store.get(job.id).last_error or "")


def test_cancelling_a_running_async_job_cancels_its_task_and_ends_it_cancelled(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    started = threading.Event()
    saw_cancel: list[bool] = []

    @registry.handler("t")
    async def waits(ctx: JobContext, job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            saw_cancel.append(ctx.is_cancelled)
            raise

    job = enqueue(store)
    worker = make_worker()
    assert started.wait(30)
    store.cancel(job.id)  # the next heartbeat leaves it out: its context, then its task
    wait_for(lambda: state_of(store, job) is State.CANCELLED)
    assert saw_cancel == [True]
    wait_for(lambda: worker.idle)


def test_an_async_handler_that_returns_after_its_cancellation_never_succeeds(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    async def swallow(ctx: JobContext, job: Job) -> str:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(60)  # swallowed: the worker still knows it was cancelled
        return "finished anyway"

    registry.register("u", swallow, timeout=dt.timedelta(milliseconds=200))
    job = enqueue(store, type="u", max_attempts=1)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    stored = store.get(job.id)
    assert stored.result is None
    assert "cancelled (timeout)" in (stored.last_error or "")


def test_a_cancel_arriving_after_an_async_handler_returned_still_lets_its_outcome_be_recorded(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    contexts: dict[Any, JobContext] = {}

    class CancelLate(WorkerHooks):
        """Cancels the job's context once its handler has returned, as a timeout
        firing at that moment does: the cancel reaches the event loop while the
        outcome is being recorded."""

        def job_started(self, job: Job, ctx: JobContext) -> None:
            contexts[job.id] = ctx

        def job_returned(self, job: Job, error: BaseException | None) -> None:
            contexts[job.id].cancel("timeout")

    @registry.handler("t")
    async def returns(ctx: JobContext, job: Job) -> str:
        await asyncio.sleep(0)
        return "done"

    job = enqueue(store, max_attempts=1)
    worker = make_worker(hooks=[CancelLate()], lease_ttl=dt.timedelta(seconds=60))
    # Recorded by this worker, not left leased for the reaper a minute later.
    wait_for(lambda: job.id in contexts and worker.idle, timeout=20)
    ended = store.get(job.id)
    assert ended.state is State.DEAD, ended
    assert "cancelled (timeout)" in (ended.last_error or "")


# -- shutdown --------------------------------------------------------------------------


def test_shutdown_lets_short_coroutines_finish_and_fails_long_ones_back_keeping_the_attempt(
    store: Store, registry: Registry
) -> None:
    started = threading.Semaphore(0)

    @registry.handler("t")
    async def work(ctx: JobContext, job: Job) -> None:
        started.release()
        await asyncio.sleep(job.payload["seconds"])

    short = [enqueue(store, payload={"seconds": 0.3}) for _ in range(3)]
    long = [enqueue(store, payload={"seconds": 120}) for _ in range(2)]
    worker = Worker(store, registry, jobrun.WorkerConfig(**FAST, concurrency=10))
    worker.start()
    for _ in range(5):
        assert started.acquire(timeout=30)
    drained = worker.stop(timeout=2.0)
    assert drained is True  # the long ones were cancelled and returned
    assert [state_of(store, j) for j in short] == [State.SUCCEEDED] * 3
    for job in long:
        stored = store.get(job.id)
        assert stored.state is State.QUEUED
        assert stored.attempts == 1  # the attempt its claim burned is kept
        assert "cancelled (worker shutting down)" in (stored.last_error or "")
    assert worker._loop is None  # the loop thread is gone with the worker
    assert not any(t.name == "jobrun-async-loop" and t.is_alive() for t in threading.enumerate())


# -- progress, hooks, the stall watch ----------------------------------------------------


class _ThreadNoting(Store):
    """The real store, noting the thread each progress write runs on."""

    progress_threads: list[str]

    def record_progress(self, job: Job, progress: float, message: str | None = None) -> dt.datetime:
        self.progress_threads.append(threading.current_thread().name)
        return super().record_progress(job, progress, message)


def test_progress_from_a_coroutine_is_written_off_the_event_loop_and_before_its_outcome(
    pool: Any, registry: Registry
) -> None:
    store = _ThreadNoting(pool)
    store.progress_threads = []

    @registry.handler("t")
    async def steps(ctx: JobContext, job: Job) -> None:
        for n in range(1, 11):
            ctx.progress(n / 10, f"step {n}")  # throttled: the first written at once
            await asyncio.sleep(0.01)

    job = enqueue(store)
    worker = Worker(
        store,
        registry,
        jobrun.WorkerConfig(**FAST, progress_interval=dt.timedelta(seconds=30)),
    )
    worker.start()
    try:
        wait_for(lambda: state_of(store, job) is State.SUCCEEDED)
    finally:
        worker.stop(5)
    stored = store.get(job.id)
    # The first report, then the last one kept by the throttle, written at the end.
    assert (stored.progress, stored.progress_message) == (1.0, "step 10")
    assert len(store.progress_threads) == 2
    assert all(name.startswith("jobrun-async-io") for name in store.progress_threads)


def test_hooks_see_an_async_job_start_return_and_finish_in_its_own_task(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    current: contextvars.ContextVar[str | None] = contextvars.ContextVar("current", default=None)
    seen: list[tuple[str, Any]] = []

    class Hooks(WorkerHooks):
        def job_started(self, job: Job, ctx: JobContext) -> None:
            current.set(job.payload["name"])  # in the job's own task context
            seen.append(("started", threading.current_thread().name))

        def job_returned(self, job: Job, error: BaseException | None) -> None:
            seen.append(("returned", current.get()))

        def job_finished(self, outcome: JobOutcome) -> None:
            seen.append((outcome.kind, outcome.job.payload["name"]))

    names: list[str | None] = []

    @registry.handler("t")
    async def handler(ctx: JobContext, job: Job) -> None:
        await asyncio.sleep(0.05)
        names.append(current.get())  # another job's hook never leaks in here

    jobs = [enqueue(store, payload={"name": f"job{n}"}) for n in range(3)]
    make_worker(hooks=[Hooks()], concurrency=3)
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in jobs))
    wait_for(lambda: sum(1 for kind, _ in seen if kind == "succeeded") == 3)
    assert sorted(n or "" for n in names) == ["job0", "job1", "job2"]
    assert [name for kind, name in seen if kind == "started"] == ["jobrun-async-loop"] * 3
    assert sorted(name for kind, name in seen if kind == "returned") == ["job0", "job1", "job2"]


def test_tracing_gives_each_concurrent_async_job_its_own_span_with_its_handlers_spans_inside(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.async")
    together = asyncio.Event()
    arrived: list[str] = []

    @registry.handler("t")
    async def handler(ctx: JobContext, job: Job) -> None:
        with tracer.start_as_current_span(f"work {job.payload['n']}"):
            arrived.append(job.payload["n"])
            if len(arrived) == 4:
                together.set()
            await asyncio.wait_for(together.wait(), 30)  # all four interleave on the loop

    jobs = [enqueue(store, payload={"n": str(n)}) for n in range(4)]
    make_worker(concurrency=4, hooks=[Tracing(tracer_provider=provider)])
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in jobs))

    def spans() -> list[Any]:
        done = list(exporter.get_finished_spans())
        consumers = [s for s in done if s.kind is SpanKind.CONSUMER]
        work = [s for s in done if s.name.startswith("work ")]
        return done if len(consumers) == 4 and len(work) == 4 else []

    done = wait_for(spans, 30)
    by_job = {
        dict(s.attributes or {})["messaging.message.id"]: s
        for s in done
        if s.kind is SpanKind.CONSUMER
    }
    for job in jobs:
        consumer = by_job[str(job.id)]
        [work] = [s for s in done if s.name == f"work {job.payload['n']}"]
        assert work.parent is not None
        assert work.parent.span_id == consumer.context.span_id  # its own job's, not another's
    provider.shutdown()


def test_a_coroutine_blocking_the_event_loop_is_named_by_the_stall_watch(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobrun")
    release = threading.Event()

    @registry.handler("t")
    async def blocks(ctx: JobContext, job: Job) -> None:
        release.wait(30)  # a blocking call inside a coroutine: the loop stops turning

    job = enqueue(store)
    worker = make_worker(stall_warning=dt.timedelta(milliseconds=500))

    def warnings() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING
            and r.getMessage().startswith("jobrun-async-loop has been stuck")
        ]

    [warning] = wait_for(lambda: warnings()[:1], 15)
    assert "blocks (test_async_handlers.py" in warning  # where: inside the coroutine
    assert "jobrun-async-loop" in worker.stalled_loops
    release.set()
    wait_for(lambda: state_of(store, job) is State.SUCCEEDED)
    wait_for(
        lambda: any(
            r.getMessage().startswith("jobrun-async-loop is moving again") for r in caplog.records
        ),
        10,
    )


# -- testing helper ---------------------------------------------------------------------


def test_run_jobs_runs_async_handlers_in_a_test_and_leaves_no_loop_behind(
    store: Store, registry: Registry
) -> None:
    @registry.handler("t")
    async def double(ctx: JobContext, job: Job) -> int:
        await asyncio.sleep(0.01)
        return int(job.payload["n"]) * 2

    jobs = [enqueue(store, payload={"n": n}) for n in range(3)]
    report = jobrun.testing.run_jobs(store, registry)
    assert report.succeeded == 3
    assert [store.get(j.id).result for j in jobs] == [0, 2, 4]
    wait_for(
        lambda: (
            not any(t.name == "jobrun-async-loop" and t.is_alive() for t in threading.enumerate())
        ),
        10,
    )
