"""ctx.progress: checked at the call, throttled, stored on the job while it runs.
In this process, against real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, Job, NewJob, State
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry, Worker, WorkerConfig
from tests.support.waiting import wait_for

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)

# Every progress write the database takes, counted by a trigger (each write
# sets progress_at to its own transaction's now()).
_COUNT_WRITES = """
CREATE TABLE public.progress_writes (job_id uuid, progress float8, message text);
CREATE FUNCTION public.count_progress_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.progress_writes VALUES (NEW.id, NEW.progress, NEW.progress_message);
  RETURN NULL;
END $$;
CREATE TRIGGER count_progress_write AFTER UPDATE OF progress ON jobrun.jobs
FOR EACH ROW WHEN (NEW.progress IS NOT NULL AND NEW.progress_at IS DISTINCT FROM OLD.progress_at)
EXECUTE FUNCTION public.count_progress_write();
"""


def enqueue(store: Store, type: str = "t", **fields: Any) -> Job:
    fields.setdefault("backoff", NO_WAIT)
    return store.enqueue(NewJob(type=type, **fields))


def writes(conn: psycopg.Connection[Any], job: Job) -> list[tuple[float, str | None]]:
    rows = conn.execute(
        "SELECT progress, message FROM public.progress_writes WHERE job_id = %s", [job.id]
    ).fetchall()
    return [(float(p), m) for p, m in rows]


def test_a_hot_loop_of_progress_reports_makes_only_a_handful_of_writes(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute(_COUNT_WRITES)
    took: list[float] = []
    calls = 100_000

    def handler(ctx: JobContext, job: Job) -> None:
        began = time.monotonic()
        for n in range(1, calls + 1):
            ctx.progress(n / calls, f"{n} of {calls}")
        took.append(time.monotonic() - began)

    registry.register("t", handler)
    job = enqueue(store)
    make_worker()
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)
    written = writes(conn, job)
    # The first at once, one per second of the loop, the held last one at return.
    assert 1 <= len(written) <= 2 + math.ceil(took[0])
    assert len(written) <= 6
    assert written[-1] == (1.0, f"{calls} of {calls}")
    stored = store.get(job.id)
    assert stored.progress == 1.0 and stored.progress_message == f"{calls} of {calls}"
    assert stored.progress_at is not None


def test_a_progress_reported_mid_run_is_visible_while_the_handler_still_runs(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    reported, go = threading.Event(), threading.Event()

    def handler(ctx: JobContext, job: Job) -> None:
        ctx.progress(0.25, "a quarter")
        reported.set()
        go.wait(30)

    registry.register("t", handler)
    job = enqueue(store)
    make_worker()
    assert reported.wait(30)
    running = store.get(job.id)
    assert running.state is State.LEASED
    assert (running.progress, running.progress_message) == (0.25, "a quarter")
    assert running.progress_at is not None and running.progress_at <= store.now()
    go.set()
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)
    assert store.get(job.id).progress == 0.25


def test_a_report_held_by_the_throttle_is_written_once_when_the_handler_fails(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute(_COUNT_WRITES)
    reported, go = threading.Event(), threading.Event()

    def handler(ctx: JobContext, job: Job) -> None:
        ctx.progress(0.1)
        ctx.progress(0.5)
        ctx.progress(0.9, "almost")  # held: within the interval of the first write
        reported.set()
        go.wait(30)
        raise RuntimeError("fell at the last step")

    registry.register("t", handler)
    job = enqueue(store, max_attempts=1)
    make_worker(progress_interval=dt.timedelta(hours=1))
    assert reported.wait(30)
    assert store.get(job.id).progress == 0.1  # only the first was written yet
    go.set()
    wait_for(lambda: store.get(job.id).state is State.DEAD)
    stored = store.get(job.id)
    assert (stored.progress, stored.progress_message) == (0.9, "almost")
    assert writes(conn, job) == [(0.1, None), (0.9, "almost")]


def test_reports_after_the_interval_are_written(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute(_COUNT_WRITES)

    def handler(ctx: JobContext, job: Job) -> None:
        for n in range(1, 4):
            ctx.progress(n / 4)
            time.sleep(0.08)

    registry.register("t", handler)
    job = enqueue(store)
    make_worker(progress_interval=dt.timedelta(milliseconds=50))
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)
    assert writes(conn, job) == [(0.25, None), (0.5, None), (0.75, None)]


BAD_VALUES: list[Any] = [-0.1, 1.5, math.nan, math.inf, "half", True, None, [0.5]]


def test_bad_progress_values_raise_a_validation_error_in_the_handler_and_write_nothing(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    raised: list[str] = []

    def handler(ctx: JobContext, job: Job) -> None:
        ctx.progress(0.5, "half way")
        for value in BAD_VALUES:
            try:
                ctx.progress(value)
            except ValidationError as exc:
                raised.append(exc.field)
        for message in ("x" * 1001, 7, "nul\x00"):
            try:
                ctx.progress(0.75, message)  # type: ignore[arg-type]
            except ValidationError as exc:
                raised.append(exc.field)

    registry.register("t", handler)
    job = enqueue(store)
    make_worker(progress_interval=dt.timedelta(milliseconds=1))
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)
    assert raised == ["progress"] * len(BAD_VALUES) + ["message"] * 3
    stored = store.get(job.id)
    assert (stored.progress, stored.progress_message) == (0.5, "half way")


def test_a_progress_write_that_finds_the_lease_gone_cancels_the_context_without_raising(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    stolen, seen = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def handler(ctx: JobContext, job: Job) -> None:
        ctx.progress(0.1)
        result["written"] = True
        stolen.wait(30)
        time.sleep(0.06)  # past the interval: the next report is written
        ctx.progress(0.2)  # must not raise
        result["cancelled"] = ctx.is_cancelled
        result["reason"] = ctx.cancel_reason
        seen.set()

    registry.register("t", handler)
    job = enqueue(store)
    # Heartbeats far apart: only the progress write can notice the lease is gone.
    worker = make_worker(
        progress_interval=dt.timedelta(milliseconds=50),
        lease_ttl=dt.timedelta(seconds=60),
        heartbeat_interval=dt.timedelta(seconds=20),
    )
    wait_for(lambda: result.get("written"))
    # Another claim holds the job now (what a reap and a new claim leave).
    conn.execute("UPDATE jobrun.jobs SET lease_token = gen_random_uuid() WHERE id = %s", [job.id])
    stolen.set()
    assert seen.wait(30)
    assert result["cancelled"] is True and result["reason"] == "lease lost"
    wait_for(lambda: worker.stats["lease_lost"] == 1)
    assert store.get(job.id).progress == 0.1


def test_a_database_error_on_a_progress_write_is_one_warning_and_does_not_fail_the_job(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn.execute(
        """
        CREATE FUNCTION public.refuse_progress() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'progress refused by a test trigger'; END $$;
        CREATE TRIGGER refuse_progress BEFORE UPDATE OF progress ON jobrun.jobs
        FOR EACH ROW WHEN (NEW.progress IS NOT NULL) EXECUTE FUNCTION public.refuse_progress();
        """
    )

    def handler(ctx: JobContext, job: Job) -> None:
        for n in range(1, 6):
            ctx.progress(n / 5)
            time.sleep(0.02)

    registry.register("t", handler)
    caplog.set_level(logging.INFO, logger="jobrun")
    job = enqueue(store, max_attempts=1)
    make_worker(progress_interval=dt.timedelta(milliseconds=10))
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)
    warnings = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "recording its progress failed" in r.getMessage()
    ]
    assert len(warnings) == 1
    assert warnings[0].job_id == str(job.id)  # type: ignore[attr-defined]
    assert "progress refused by a test trigger" in warnings[0].getMessage()
    assert store.get(job.id).progress is None


def test_progress_on_a_context_made_without_a_worker_is_kept_in_memory(store: Store) -> None:
    job = enqueue(store)
    ctx = JobContext(job=job, cancelled=threading.Event(), deadline=None)
    before = ctx.progress_value
    ctx.progress(0.4, "reading")
    ctx.progress(1)
    ctx.flush_progress()
    assert before is None
    assert (ctx.progress_value, ctx.progress_message) == (1.0, None)
    with pytest.raises(ValidationError):
        ctx.progress(2)
    assert store.get(job.id).progress is None


def test_the_progress_interval_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="progress_interval"):
        WorkerConfig(progress_interval=dt.timedelta(0))
    assert WorkerConfig().progress_interval == dt.timedelta(seconds=1)
