"""Worker hooks: what a hook sees of each job and each Store round trip, and that a
raising hook never hurts a job. In this process, against real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import jobrun
from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, Job, NewJob, State
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, PermanentFailure, Registry, Worker
from jobrun.worker.hooks import JobOutcome, StoreCall, WorkerHooks, pickup_delay
from tests.support.waiting import wait_for

SLOW_RETRY = Backoff(kind="constant", base=600.0, jitter=0.0)


class Recorder(WorkerHooks):
    """Every call, with the thread it came on."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[tuple[Job, str]] = []
        self.returned: list[tuple[Job, BaseException | None, str]] = []
        self.finished: list[JobOutcome] = []
        self.calls: list[StoreCall] = []

    def job_started(self, job: Job, ctx: JobContext) -> None:
        with self.lock:
            self.started.append((job, threading.current_thread().name))

    def job_returned(self, job: Job, error: BaseException | None) -> None:
        with self.lock:
            self.returned.append((job, error, threading.current_thread().name))

    def job_finished(self, outcome: JobOutcome) -> None:
        with self.lock:
            self.finished.append(outcome)

    def store_call(self, call: StoreCall) -> None:
        with self.lock:
            self.calls.append(call)

    def outcome(self, job: Job) -> JobOutcome | None:
        with self.lock:
            found = [o for o in self.finished if o.job.id == job.id]
        assert len(found) <= 1, found
        return found[0] if found else None


def enqueue(store: Store, type: str, **fields: Any) -> Job:
    fields.setdefault("backoff", SLOW_RETRY)
    return store.enqueue(NewJob(type=type, **fields))


def test_a_hook_sees_each_outcome_once_recorded_with_its_details(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    def give(ctx: JobContext, job: Job) -> Any:
        return {"n": job.payload["n"]}

    def boom(ctx: JobContext, job: Job) -> None:
        raise ValueError("boom")

    def fatal(ctx: JobContext, job: Job) -> None:
        raise PermanentFailure("never")

    registry.register("give", give)
    registry.register("boom", boom)
    registry.register("fatal", fatal)
    jobs = {
        "succeeded": enqueue(store, "give", payload={"n": 7}),
        "failed": enqueue(store, "boom"),
        "dead": enqueue(store, "fatal"),
        "released": enqueue(store, "no.such.type"),
    }
    hooks = Recorder()
    worker = make_worker(hooks=[hooks], concurrency=4)
    wait_for(lambda: all(hooks.outcome(j) for j in jobs.values()))
    worker.stop(5)

    for kind, job in jobs.items():
        outcome = hooks.outcome(job)
        assert outcome is not None and outcome.kind == kind, (kind, outcome)
        assert outcome.job.attempts == 1  # the job as this claim saw it
    stored = {kind: store.get(job.id) for kind, job in jobs.items()}
    assert stored["succeeded"].state is State.SUCCEEDED
    succeeded = hooks.outcome(jobs["succeeded"])
    assert succeeded is not None and succeeded.result == {"n": 7}
    assert succeeded.duration is not None and succeeded.duration >= 0
    failed = hooks.outcome(jobs["failed"])
    assert failed is not None and isinstance(failed.error, ValueError)
    assert failed.next_run_at == stored["failed"].run_at  # the database's answer
    assert failed.error_text is not None and failed.error_text.startswith("ValueError: boom")
    dead = hooks.outcome(jobs["dead"])
    assert dead is not None and isinstance(dead.error, PermanentFailure)
    assert dead.next_run_at is None and stored["dead"].state is State.DEAD
    released = hooks.outcome(jobs["released"])
    assert released is not None and released.duration is None  # no handler ran
    assert released.next_run_at == stored["released"].run_at
    assert stored["released"].state is State.QUEUED
    assert stored["released"].attempts == 0  # a release gives the attempt back


def test_started_and_returned_come_in_pairs_on_the_handlers_own_thread(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    seen_on: dict[str, str] = {}

    def handler(ctx: JobContext, job: Job) -> None:
        seen_on[str(job.id)] = threading.current_thread().name
        if job.payload.get("fail"):
            raise RuntimeError("no")

    registry.register("t", handler)
    ok, bad = enqueue(store, "t"), enqueue(store, "t", payload={"fail": True})
    hooks = Recorder()
    make_worker(hooks=[hooks], concurrency=2)
    wait_for(lambda: hooks.outcome(ok) and hooks.outcome(bad))
    for job in (ok, bad):
        (started_on,) = [name for j, name in hooks.started if j.id == job.id]
        ((_, error, returned_on),) = [(j, e, n) for j, e, n in hooks.returned if j.id == job.id]
        assert started_on == returned_on == seen_on[str(job.id)]
        assert started_on.startswith("jobrun-handler-")
        assert (error is None) is (job is ok)
    ((_, error, _),) = [r for r in hooks.returned if r[0].id == bad.id]
    assert isinstance(error, RuntimeError)


def test_a_cancelled_and_a_lease_lost_job_are_reported_as_such(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    running = threading.Event()
    release = threading.Event()

    def handler(ctx: JobContext, job: Job) -> None:
        running.set()
        release.wait(10)

    registry.register("t", handler)
    cancelled = enqueue(store, "t")
    hooks = Recorder()
    make_worker(hooks=[hooks], concurrency=1)
    wait_for(running.is_set)
    store.cancel(cancelled.id)  # cancel wins over the success that follows
    release.set()
    wait_for(lambda: hooks.outcome(cancelled))
    outcome = hooks.outcome(cancelled)
    assert outcome is not None and outcome.kind == "cancelled"

    running.clear()
    release.clear()
    lost = enqueue(store, "t")
    wait_for(running.is_set)
    # Another claim takes the job over: this worker's token no longer matches.
    conn.execute("UPDATE jobrun.jobs SET lease_token = gen_random_uuid() WHERE id = %s", [lost.id])
    release.set()
    wait_for(lambda: hooks.outcome(lost))
    outcome = hooks.outcome(lost)
    assert outcome is not None and outcome.kind == "lease_lost"


def test_every_store_round_trip_of_the_worker_is_reported(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    registry.register("ok", lambda ctx, job: None)
    registry.register("slow", lambda ctx, job: time.sleep(0.6))

    def fails(ctx: JobContext, job: Job) -> None:
        raise ValueError("x")

    registry.register("fails", fails)
    jobs = [enqueue(store, "ok") for _ in range(5)] + [enqueue(store, "fails")]
    slow = enqueue(store, "slow")  # heartbeated while it runs (every 200 ms here)
    hooks = Recorder()
    make_worker(hooks=[hooks], concurrency=4)
    wait_for(lambda: all(hooks.outcome(j) for j in [*jobs, slow]))
    with hooks.lock:
        calls = list(hooks.calls)
    by_op: dict[str, list[StoreCall]] = {}
    for call in calls:
        by_op.setdefault(call.operation, []).append(call)
    assert sum(c.jobs for c in by_op["claim"]) == 7
    assert all(c.queues == ("default",) for c in by_op["claim"])
    # Five plain ones and the slow one, alone or with a claim's round.
    completed = by_op.get("complete", []) + by_op["claim"]
    assert sum(c.completed if c.operation == "claim" else c.jobs for c in completed) == 6
    assert [c.jobs for c in by_op["fail"]] == [1]
    assert by_op["heartbeat"] and all(c.jobs >= 1 for c in by_op["heartbeat"])
    assert all(c.error is None and c.seconds >= 0 for c in calls)


def test_pickup_delay_is_measured_from_when_the_job_was_due_by_the_database_clock(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    registry.register("t", lambda ctx, job: None)
    job = enqueue(store, "t", delay=dt.timedelta(seconds=1))
    hooks = Recorder()
    make_worker(hooks=[hooks])
    wait_for(lambda: hooks.outcome(job))
    ((claimed, _),) = hooks.started
    delay = pickup_delay(claimed)
    due = store.get(job.id).run_at
    assert claimed.updated_at >= due  # claimed after it was due, by the server's clock
    assert delay == pytest.approx((claimed.updated_at - due).total_seconds(), abs=1e-6)
    assert delay < 5


class Raising(WorkerHooks):
    def __init__(self) -> None:
        self.calls = 0

    def job_started(self, job: Job, ctx: JobContext) -> None:
        self.calls += 1
        raise RuntimeError("the hook is broken")

    def job_finished(self, outcome: JobOutcome) -> None:
        raise RuntimeError("the hook is broken too")

    def store_call(self, call: StoreCall) -> None:
        raise KeyError("and this one")


def test_a_raising_hook_is_logged_and_never_fails_the_job_nor_the_next_hook(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="jobrun")
    registry.register("t", lambda ctx, job: "fine")
    jobs = [enqueue(store, "t") for _ in range(4)]
    broken, recorder = Raising(), Recorder()
    make_worker(hooks=[broken, recorder], concurrency=2)
    wait_for(lambda: all(recorder.outcome(j) for j in jobs))
    assert all(store.get(j.id).state is State.SUCCEEDED for j in jobs)
    assert broken.calls == 4
    warnings = [r for r in caplog.records if r.name == "jobrun.worker.hooks"]
    methods = sorted({r.getMessage().split(" raised")[0] for r in warnings})
    assert methods == [
        "the hook Raising.job_finished",
        "the hook Raising.job_started",
        "the hook Raising.store_call",
    ]
    assert len(warnings) == 3  # once a minute per method, not once per job
    assert all(r.exc_info for r in warnings)


def test_a_hook_that_is_not_a_worker_hooks_is_refused_at_construction(
    store: Store, registry: Registry
) -> None:
    class DuckTyped:
        def job_started(self, job: Job, ctx: JobContext) -> None: ...

    with pytest.raises(ValidationError, match="WorkerHooks"):
        Worker(store, registry, hooks=[DuckTyped()])  # type: ignore[list-item]


def test_runtime_hands_its_hooks_to_its_worker(dsn: str) -> None:
    registry = jobrun.Registry()
    registry.register("t", lambda ctx, job: 1)
    hooks = Recorder()
    settings = jobrun.Settings(database_url=dsn, poll_interval=dt.timedelta(milliseconds=200))
    with (
        jobrun.Runtime(settings, registry, scheduler=False, hooks=[hooks]),
        jobrun.Client.connect(settings=settings) as client,
    ):
        job = client.enqueue("t")
        wait_for(lambda: hooks.outcome(job))
    outcome = hooks.outcome(job)
    assert outcome is not None and outcome.kind == "succeeded" and outcome.result == 1


def test_the_worker_counts_its_busy_threads_and_names_none_dead_while_healthy(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    gate = threading.Event()
    registry.register("t", lambda ctx, job: gate.wait(10))
    for _ in range(3):
        enqueue(store, "t")
    worker = make_worker(concurrency=4)
    assert worker.concurrency == 4
    wait_for(lambda: worker.threads_busy == 3)
    assert worker.dead_threads == []
    gate.set()
    wait_for(lambda: worker.threads_busy == 0)


def test_a_job_abandoned_by_an_unexpected_error_still_ends_for_the_hooks(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    def exits(ctx: JobContext, job: Job) -> None:
        raise SystemExit(3)  # not an Exception: the worker abandons the claim

    registry.register("t", exits)
    job = enqueue(store, "t")
    hooks = Recorder()
    make_worker(hooks=[hooks])
    wait_for(lambda: hooks.outcome(job))
    outcome = hooks.outcome(job)
    assert outcome is not None and outcome.kind == "lease_lost"
    assert isinstance(outcome.error, SystemExit)
    assert store.get(job.id).state is State.LEASED  # its lease expires; the reaper takes it


def test_a_method_overridden_in_a_base_class_of_the_hook_is_called_too(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    seen: list[str] = []

    class Finished(WorkerHooks):
        def job_finished(self, outcome: JobOutcome) -> None:
            seen.append(outcome.kind)

    class Mine(Finished):  # overrides nothing itself
        pass

    registry.register("t", lambda ctx, job: None)
    enqueue(store, "t")
    make_worker(hooks=[Mine()])
    wait_for(lambda: seen == ["succeeded"])
