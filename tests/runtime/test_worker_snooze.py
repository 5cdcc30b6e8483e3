"""A handler's Snooze: queued again later with its attempt given back, bounded by
max_snoozes, cancel still wins. In this process, against real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest

import jobrun
from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, EventKind, Job, NewJob, State
from jobrun.observe.metrics import Metrics
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry, Snooze, Worker
from jobrun.worker.hooks import JobOutcome, WorkerHooks
from tests.support.waiting import wait_for

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)
SOON = dt.timedelta(milliseconds=1)
QUICK = {"poll_interval": dt.timedelta(milliseconds=20)}
"""A snoozed job sends no wake-up: poll often, so that many snoozes take little time."""


class Outcomes(WorkerHooks):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[JobOutcome] = []

    def job_finished(self, outcome: JobOutcome) -> None:
        with self.lock:
            self.seen.append(outcome)

    def of(self, job: Job) -> list[JobOutcome]:
        with self.lock:
            return [o for o in self.seen if o.job.id == job.id]


def enqueue(store: Store, type: str = "t", **fields: Any) -> Job:
    fields.setdefault("backoff", NO_WAIT)
    return store.enqueue(NewJob(type=type, **fields))


def kinds(store: Store, job: Job) -> list[EventKind]:
    """The job's events but its claims."""
    return [e.kind for e in store.events(job.id) if e.kind is not EventKind.CLAIMED]


def test_a_snooze_requeues_the_job_after_its_delay_with_the_attempt_given_back(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        raise Snooze(60)

    registry.register("t", handler)
    caplog.set_level(logging.INFO, logger="jobrun")
    job = enqueue(store, max_attempts=3)
    hooks = Outcomes()
    worker = make_worker(hooks=[hooks])
    wait_for(lambda: worker.stats["snoozed"] == 1)
    stored = store.get(job.id)
    assert stored.state is State.QUEUED
    assert stored.attempts == 0 and stored.snoozes == 1
    assert stored.last_error is None  # a snooze is no error
    assert stored.run_at - stored.updated_at == pytest.approx(
        dt.timedelta(seconds=60), abs=dt.timedelta(milliseconds=100)
    )
    assert kinds(store, job)[-1] is EventKind.SNOOZED
    assert worker.stats["failed"] == 0

    (outcome,) = wait_for(lambda: hooks.of(job))
    assert outcome.kind == "snoozed" and outcome.error is None
    assert outcome.next_run_at == stored.run_at
    assert outcome.duration is not None and outcome.duration >= 0

    (record,) = [r for r in caplog.records if getattr(r, "outcome", None) == "snoozed"]
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("snoozed for 60 s")
    assert record.job_id == str(job.id) and record.job_type == "t"  # type: ignore[attr-defined]
    next_run = dt.datetime.fromisoformat(record.next_run_at)  # type: ignore[attr-defined]
    assert abs(next_run - stored.run_at) < dt.timedelta(milliseconds=1)


def test_a_returned_snooze_works_like_a_raised_one(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    registry.register("t", lambda ctx, job: jobrun.Snooze(dt.timedelta(minutes=5)))
    job = enqueue(store)
    worker = make_worker()
    wait_for(lambda: worker.stats["snoozed"] == 1)
    stored = store.get(job.id)
    assert (stored.state, stored.attempts, stored.snoozes) == (State.QUEUED, 0, 1)
    assert stored.run_at - stored.updated_at == pytest.approx(
        dt.timedelta(minutes=5), abs=dt.timedelta(milliseconds=100)
    )
    assert stored.result is None


def test_thirty_snoozes_burn_no_attempt_so_the_job_still_gets_all_its_attempts(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    runs: list[tuple[int, int]] = []

    def handler(ctx: JobContext, job: Job) -> None:
        runs.append((job.snoozes, job.attempts))
        if job.snoozes < 30:
            raise Snooze(SOON)
        raise RuntimeError("really broken")

    registry.register("t", handler)
    job = enqueue(store, max_attempts=3)
    worker = make_worker(**QUICK)
    wait_for(lambda: store.get(job.id).state is State.DEAD, timeout=60)
    stored = store.get(job.id)
    assert stored.attempts == 3 and stored.snoozes == 30
    assert runs == [(n, 1) for n in range(30)] + [(30, 1), (30, 2), (30, 3)]
    events = kinds(store, job)
    assert events.count(EventKind.SNOOZED) == 30
    assert events[-1] is EventKind.DEAD
    assert "really broken" in (stored.last_error or "")
    assert worker.stats["snoozed"] == 30 and worker.stats["failed"] == 3


def test_a_job_that_snoozes_forever_is_dead_after_max_snoozes_and_its_attempts(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    calls: list[int] = []

    def handler(ctx: JobContext, job: Job) -> None:
        calls.append(job.attempts)
        raise Snooze(SOON)

    registry.register("t", handler, max_snoozes=3)
    job = enqueue(store, max_attempts=2)
    hooks = Outcomes()
    make_worker(hooks=[hooks], **QUICK)
    wait_for(lambda: store.get(job.id).state is State.DEAD)
    stored = store.get(job.id)
    assert stored.snoozes == 3 and stored.attempts == 2
    assert len(calls) == 3 + 2
    assert "snoozed more than 3 times" in (stored.last_error or "")
    events = kinds(store, job)
    assert events.count(EventKind.SNOOZED) == 3
    assert events[-2:] == [EventKind.RETRYING, EventKind.DEAD]
    wait_for(lambda: len(hooks.of(job)) == 5)
    assert [o.kind for o in hooks.of(job)] == ["snoozed"] * 3 + ["failed", "dead"]


def test_max_snoozes_zero_makes_every_snooze_a_failed_attempt(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    @registry.handler("t", max_snoozes=0)
    def handler(ctx: JobContext, job: Job) -> None:
        raise Snooze(60)

    job = enqueue(store, max_attempts=1)
    make_worker()
    wait_for(lambda: store.get(job.id).state is State.DEAD)
    stored = store.get(job.id)
    assert stored.snoozes == 0 and stored.attempts == 1
    assert "snoozed more than 0 times" in (stored.last_error or "")


def test_a_cancel_requested_while_running_wins_over_the_snooze(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    started, go = threading.Event(), threading.Event()

    def handler(ctx: JobContext, job: Job) -> None:
        started.set()
        go.wait(30)
        raise Snooze(60)

    registry.register("t", handler)
    job = enqueue(store)
    hooks = Outcomes()
    worker = make_worker(hooks=[hooks])
    assert started.wait(30)
    store.cancel(job.id)
    go.set()
    wait_for(lambda: store.get(job.id).state is State.CANCELLED)
    stored = store.get(job.id)
    assert stored.snoozes == 0
    assert worker.stats["cancelled"] == 1 and worker.stats["snoozed"] == 0
    (outcome,) = wait_for(lambda: hooks.of(job))
    assert outcome.kind == "cancelled"


def test_a_bad_snooze_delay_fails_that_attempt_with_a_clear_message(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        if job.payload["bad"]:
            raise Snooze(-5)

    registry.register("t", handler)
    bad = enqueue(store, payload={"bad": True}, max_attempts=1)
    worker = make_worker()
    wait_for(lambda: store.get(bad.id).state is State.DEAD)
    error = store.get(bad.id).last_error or ""
    assert error.startswith("ValidationError: delay: Snooze(delay) must be positive")
    good = enqueue(store, payload={"bad": False})
    wait_for(lambda: store.get(good.id).state is State.SUCCEEDED)  # the worker runs on
    assert worker.dead_threads == []


@pytest.mark.parametrize(
    "delay",
    [
        0,
        0.0,
        -1,
        dt.timedelta(0),
        dt.timedelta(seconds=-3),
        math.nan,
        math.inf,
        1e-9,
        True,
        "30",
        None,
        11 * 365 * 24 * 3600,
        dt.timedelta(days=11 * 365),
    ],
)
def test_a_snooze_refuses_a_bad_delay_where_it_is_made(delay: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        Snooze(delay)
    assert caught.value.field == "delay"
    assert "Snooze(delay)" in str(caught.value) or "at most" in str(caught.value)


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [(30, 30.0), (0.25, 0.25), (dt.timedelta(minutes=2), 120.0)],
)
def test_a_snooze_takes_a_timedelta_or_seconds(delay: Any, seconds: float) -> None:
    snooze = Snooze(delay)
    assert snooze.delay == dt.timedelta(seconds=seconds)
    assert str(snooze) == f"snooze for {seconds:g} s"


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_max_snoozes_must_be_none_or_a_count(bad: Any) -> None:
    with pytest.raises(ValidationError, match="max_snoozes"):
        Registry().register("t", lambda ctx, job: None, max_snoozes=bad)


def test_snoozes_are_counted_under_the_jobs_own_type_in_the_metrics(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        if job.snoozes < 2:
            raise Snooze(SOON)

    registry.register("t", handler)
    metrics = Metrics()
    job = enqueue(store)
    worker = make_worker(hooks=[metrics], **QUICK)
    metrics.watch_worker(worker)
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)

    def finished(type: str, outcome: str) -> float | None:
        return metrics.registry.get_sample_value(
            "jobrun_jobs_finished_total", {"queue": "default", "type": type, "outcome": outcome}
        )

    wait_for(lambda: finished("t", "succeeded") == 1)
    assert finished("t", "snoozed") == 2
    assert finished("unknown", "released") is None  # a snooze is no unknown type's release
    assert (
        metrics.registry.get_sample_value(
            "jobrun_job_run_duration_seconds_count", {"queue": "default", "type": "t"}
        )
        == 3
    )
