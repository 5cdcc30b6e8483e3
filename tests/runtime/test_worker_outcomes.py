"""What a handler's return value means, unknown job types, and the worker's outcome lines.

In this process, against real PostgreSQL (the console of a real ``jobrun
worker`` process is tests/acceptance/test_worker_console.py).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import jobrun
from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, EventKind, Job, NewJob, State
from jobrun.postgres.store import Store
from jobrun.worker import Done, JobContext, PermanentFailure, Registry, Worker, logs
from tests.support.waiting import wait_for

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)
JOB_FIELDS = {"job_id", "job_type", "attempt", "max_attempts", "queue"}


def enqueue(store: Store, type: str = "t", **fields: Any) -> Job:
    fields.setdefault("backoff", NO_WAIT)
    return store.enqueue(NewJob(type=type, **fields))


def state_of(store: Store, job: Job) -> State:
    return store.get(job.id).state


def outcome_records(caplog: pytest.LogCaptureFixture, job: Job) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "jobrun.worker" and getattr(r, "job_id", None) == str(job.id)
    ]


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="jobrun")
    return caplog


# -- results ---------------------------------------------------------------------------


def test_a_returned_json_value_is_stored_as_the_jobs_result_with_its_success(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    registry.register("t", lambda ctx, job: job.payload["give"])
    values: list[Any] = [{"sent": 3, "to": ["a@b.c"]}, [1, 2], "done", 0, False]
    jobs = [enqueue(store, payload={"give": v}) for v in values]
    make_worker(concurrency=4)
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in jobs))
    assert [store.get(j.id).result for j in jobs] == values


def test_done_stores_the_result_and_runs_the_commit_callable_in_the_same_transaction(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    conn.execute("CREATE TABLE side (job_id uuid PRIMARY KEY)")

    def handler(ctx: JobContext, job: Job) -> Done:
        def commit(c: psycopg.Connection[Any]) -> None:
            c.execute("INSERT INTO side VALUES (%s)", [job.id])

        return jobrun.Done(result={"rows": 1}, commit=commit)

    registry.register("t", handler)
    jobs = [enqueue(store) for _ in range(6)]
    make_worker(concurrency=3)
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in jobs))
    assert all(store.get(j.id).result == {"rows": 1} for j in jobs)
    assert conn.execute("SELECT count(*) FROM side").fetchone() == (6,)


def test_results_survive_a_commit_batch_that_falls_back_to_one_by_one(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    conn.execute("CREATE TABLE side (job_id uuid PRIMARY KEY)")
    gate = threading.Barrier(4, timeout=30)

    def handler(ctx: JobContext, job: Job) -> Done:
        def commit(c: psycopg.Connection[Any]) -> None:
            if job.payload["bad"]:
                raise ValueError("this one's commit fails")
            c.execute("INSERT INTO side VALUES (%s)", [job.id])

        gate.wait()  # the four return together: one batch
        return Done(result={"n": job.payload["n"]}, commit=commit)

    registry.register("t", handler)
    jobs = [enqueue(store, payload={"n": n, "bad": n == 0}, max_attempts=1) for n in range(4)]
    make_worker(concurrency=4)
    wait_for(lambda: all(state_of(store, j) in (State.SUCCEEDED, State.DEAD) for j in jobs))
    assert state_of(store, jobs[0]) is State.DEAD
    assert store.get(jobs[0].id).result is None
    assert [store.get(j.id).result for j in jobs[1:]] == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_a_result_is_checked_and_serialised_once_on_its_way_to_the_database(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The handler's thread checks the value (so a bad one fails its own
    # attempt); the completer then stores that text, not a second encoding.
    returned = {"rows": list(range(1000))}
    encodings: list[object] = []
    payload = validate.payload

    def counting(value: Any) -> Any:
        if isinstance(value, dict) and value.get("result") is returned:
            encodings.append(value)
        return payload(value)

    monkeypatch.setattr(validate, "payload", counting)
    registry.register("t", lambda ctx, job: returned)
    job = enqueue(store)
    make_worker(concurrency=1)
    wait_for(lambda: state_of(store, job) is State.SUCCEEDED)
    assert store.get(job.id).result == returned
    assert len(encodings) == 1


def test_an_unstorable_result_fails_its_own_attempt_naming_result_and_spares_its_batch(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    gate = threading.Barrier(3, timeout=30)

    def handler(ctx: JobContext, job: Job) -> Any:
        gate.wait()
        return {1, 2} if job.payload["bad"] else {"ok": True}

    registry.register("t", handler)
    bad = enqueue(store, payload={"bad": True}, max_attempts=1)
    good = [enqueue(store, payload={"bad": False}) for _ in range(2)]
    make_worker(concurrency=3)
    wait_for(lambda: state_of(store, bad) is State.DEAD)
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in good))
    error = store.get(bad.id).last_error or ""
    assert "cannot be stored as the job's result" in error and "result:" in error
    assert all(store.get(j.id).result == {"ok": True} for j in good)


def test_done_refuses_a_commit_that_is_not_callable() -> None:
    with pytest.raises(ValidationError, match="commit"):
        Done(result=1, commit="INSERT ...")  # type: ignore[arg-type]


# -- async handlers ----------------------------------------------------------------------


async def _async_handler(ctx: JobContext, job: Job) -> None:
    return None


# Registering async def handlers: tests/runtime/test_async_handlers.py.


def test_a_handler_that_returns_a_coroutine_anyway_is_dead_at_its_first_attempt(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    def sync_wrapper(ctx: JobContext, job: Job) -> Any:
        return _async_handler(ctx, job)

    registry.register("t", sync_wrapper)
    job = enqueue(store, max_attempts=5)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    stored = store.get(job.id)
    assert stored.attempts == 1
    assert "returned a coroutine" in (stored.last_error or "")


# -- unknown job types -------------------------------------------------------------------


def test_an_unknown_type_is_released_and_warned_about_once_naming_the_known_types(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    registry.register("email.send", lambda ctx, job: None)
    registry.register("report.build", lambda ctx, job: None)
    jobs = [enqueue(store, type="emial.send", max_attempts=3) for _ in range(3)]
    worker = make_worker()
    wait_for(lambda: worker.stats["released"] == 3)
    for job in jobs:
        stored = store.get(job.id)
        assert stored.state is State.QUEUED and stored.attempts == 0
        assert stored.run_at - stored.updated_at == pytest.approx(
            dt.timedelta(seconds=60), abs=dt.timedelta(seconds=1)
        )
        assert store.events(job.id)[-1].kind is EventKind.RELEASED
        assert "release 1 of 24, attempt not counted" in (stored.last_error or "")
    released = [r for r in debug_logs.records if getattr(r, "outcome", None) == "released"]
    warnings = [r for r in released if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'emial.send'" in warnings[0].getMessage()
    assert "it knows: email.send, report.build" in warnings[0].getMessage()
    assert [r.levelno for r in released if r not in warnings] == [logging.DEBUG] * 2


def test_an_unknown_type_is_dead_after_its_release_limit_without_burning_attempts(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    registry.register("known", lambda ctx, job: None)
    job = enqueue(store, type="unknown.type", max_attempts=25)
    worker = make_worker(unknown_type_delay=dt.timedelta(milliseconds=50), unknown_type_releases=3)
    wait_for(lambda: state_of(store, job) is State.DEAD)
    stored = store.get(job.id)
    assert worker.stats["released"] == 3
    assert stored.attempts == 1  # three releases gave theirs back; the dead verdict keeps one
    assert "jobrun retry" in (stored.last_error or "")
    kinds = [e.kind for e in store.events(job.id)]
    assert kinds.count(EventKind.RELEASED) == 3 and kinds[-1] is EventKind.DEAD


def test_the_release_count_is_the_jobs_own_column_read_by_any_worker(
    store: Store, registry: Registry, make_worker: Callable[..., Worker], conn: Any
) -> None:
    # Seven releases by other workers; last_error's prose is not parsed (it
    # once carried the count, read back with a pattern).
    job = enqueue(store, type="unknown.type")
    conn.execute(
        "UPDATE jobrun.jobs SET releases = 7, last_error = %s WHERE id = %s",
        ["no handler for job type 'unknown.type' (release 2 of 24, ...)", job.id],
    )
    worker = make_worker()
    wait_for(lambda: worker.stats["released"] == 1)
    stored = store.get(job.id)
    assert "release 8 of 24" in (stored.last_error or "")
    assert stored.run_at - stored.updated_at == pytest.approx(
        dt.timedelta(minutes=10), abs=dt.timedelta(seconds=1)
    )


def test_a_zero_release_limit_makes_an_unknown_type_dead_at_once(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    job = enqueue(store, type="unknown.type")
    make_worker(unknown_type_releases=0)
    wait_for(lambda: state_of(store, job) is State.DEAD)
    assert "no handler for job type 'unknown.type'" in (store.get(job.id).last_error or "")


# -- outcome lines -----------------------------------------------------------------------


def test_a_success_is_one_line_with_the_job_fields_at_debug_by_default(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    registry.register("t", lambda ctx, job: None)
    job = enqueue(store, queue="default", max_attempts=7)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.SUCCEEDED)
    wait_for(lambda: outcome_records(debug_logs, job))
    (record,) = outcome_records(debug_logs, job)
    assert record.levelno == logging.DEBUG
    assert record.getMessage().startswith("succeeded in ")
    fields = {k: getattr(record, k) for k in JOB_FIELDS}
    assert fields == {
        "job_id": str(job.id),
        "job_type": "t",
        "attempt": 1,
        "max_attempts": 7,
        "queue": "default",
    }
    assert record.outcome == "succeeded"  # type: ignore[attr-defined]
    assert record.duration_ms >= 0  # type: ignore[attr-defined]


def test_the_success_line_is_info_when_configured(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    registry.register("t", lambda ctx, job: {"n": 1})
    job = enqueue(store)
    make_worker(success_log_level="info")
    wait_for(lambda: outcome_records(debug_logs, job))
    (record,) = outcome_records(debug_logs, job)
    assert record.levelno == logging.INFO
    assert record.getMessage().endswith("result stored")


def test_a_failure_names_the_next_run_and_the_error_and_carries_the_traceback_at_debug(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        raise ValueError(f"boom {job.payload['n']}")

    registry.register("t", handler)
    slow = Backoff(kind="constant", base=600.0, jitter=0.0)
    caplog.set_level(logging.INFO, logger="jobrun")
    quiet = enqueue(store, payload={"n": 1}, backoff=slow)
    worker = make_worker()
    wait_for(lambda: outcome_records(caplog, quiet))
    caplog.set_level(logging.DEBUG, logger="jobrun")
    loud = enqueue(store, payload={"n": 2}, backoff=slow)
    wait_for(lambda: outcome_records(caplog, loud))
    worker.stop(5)
    for job, traceback in ((quiet, False), (loud, True)):
        (record,) = outcome_records(caplog, job)
        stored = store.get(job.id)
        assert record.levelno == logging.INFO
        assert record.outcome == "failed"  # type: ignore[attr-defined]
        assert record.error == f"ValueError: boom {job.payload['n']}"  # type: ignore[attr-defined]
        next_run = dt.datetime.fromisoformat(record.next_run_at)  # type: ignore[attr-defined]
        assert abs(next_run - stored.run_at) < dt.timedelta(milliseconds=1)
        assert "next attempt (2 of 25)" in record.getMessage()
        assert (record.exc_info is not None) is traceback


def test_a_failed_jobs_stored_traceback_starts_at_the_handler_not_inside_the_worker(
    store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    def parse(text: str) -> int:
        return int(text)

    def handler(ctx: JobContext, job: Job) -> None:
        parse(job.payload["n"])

    registry.register("t", handler)
    job = enqueue(store, payload={"n": "x"}, max_attempts=1)
    make_worker()
    wait_for(lambda: state_of(store, job) is State.DEAD)
    error = store.get(job.id).last_error or ""
    lines = error.splitlines()
    assert lines[0] == "ValueError: invalid literal for int() with base 10: 'x'"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[2].startswith(f'  File "{__file__}"') and lines[2].endswith("in handler")
    assert "in parse" in error
    assert "jobrun/worker" not in error  # the frames that called the handler say nothing


def test_dead_and_permanent_failures_are_warnings(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        if job.payload["permanent"]:
            raise PermanentFailure("bad input")
        raise RuntimeError("still broken")

    registry.register("t", handler)
    caplog.set_level(logging.INFO, logger="jobrun")
    permanent = enqueue(store, payload={"permanent": True})
    exhausted = enqueue(store, payload={"permanent": False}, max_attempts=2)
    make_worker()
    wait_for(lambda: all(state_of(store, j) is State.DEAD for j in (permanent, exhausted)))
    wait_for(lambda: len(outcome_records(caplog, exhausted)) == 2)
    (record,) = outcome_records(caplog, permanent)
    assert (record.levelno, record.outcome) == (logging.WARNING, "dead")  # type: ignore[attr-defined]
    assert "permanent failure" in record.getMessage() and "bad input" in record.getMessage()
    first, last = outcome_records(caplog, exhausted)
    assert (first.levelno, first.outcome) == (logging.INFO, "failed")  # type: ignore[attr-defined]
    assert (last.levelno, last.outcome) == (logging.WARNING, "dead")  # type: ignore[attr-defined]
    assert (last.attempt, last.max_attempts) == (2, 2)  # type: ignore[attr-defined]
    assert "no attempts left" in last.getMessage()


def test_a_cancelled_job_is_one_info_line(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = threading.Event()

    def handler(ctx: JobContext, job: Job) -> None:
        started.set()
        ctx.cancelled.wait(30)

    registry.register("t", handler)
    caplog.set_level(logging.INFO, logger="jobrun")
    job = enqueue(store)
    make_worker()
    assert started.wait(30)
    store.cancel(job.id)
    wait_for(lambda: state_of(store, job) is State.CANCELLED)
    wait_for(lambda: outcome_records(caplog, job))
    lines = [r for r in outcome_records(caplog, job) if getattr(r, "outcome", None)]
    assert [(r.levelno, r.outcome) for r in lines] == [(logging.INFO, "cancelled")]  # type: ignore[attr-defined]


def test_a_lost_lease_is_a_warning_naming_the_job(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = threading.Event()
    proceed = threading.Event()

    def handler(ctx: JobContext, job: Job) -> None:
        started.set()
        proceed.wait(30)

    registry.register("t", handler)
    caplog.set_level(logging.INFO, logger="jobrun")
    job = enqueue(store, backoff=Backoff(kind="constant", base=3600.0, jitter=0.0))
    worker = make_worker(
        heartbeat_interval=dt.timedelta(seconds=10), lease_ttl=dt.timedelta(seconds=30)
    )
    assert started.wait(30)
    conn.execute(
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s", [job.id]
    )
    assert store.reap_expired(store.now(), 10).requeued == [job.id]
    proceed.set()
    wait_for(lambda: worker.stats["lease_lost"] >= 1)
    lost = [r for r in outcome_records(caplog, job) if getattr(r, "outcome", None) == "lease_lost"]
    assert [r.levelno for r in lost] == [logging.WARNING]
    assert "lease lost" in lost[0].getMessage()


def test_a_handlers_own_log_lines_carry_the_job_fields(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry.register("t.x", lambda ctx, job: ctx.logger.info("working on %s", job.payload["n"]))
    caplog.set_level(logging.INFO, logger="jobrun")
    job = enqueue(store, type="t.x", payload={"n": 5}, queue="q1", max_attempts=4)
    make_worker(queues="q1")
    wait_for(lambda: state_of(store, job) is State.SUCCEEDED)
    (record,) = [r for r in caplog.records if r.name == "jobrun.job.t.x"]
    assert record.getMessage() == "working on 5"
    assert {k: getattr(record, k) for k in JOB_FIELDS} == {
        "job_id": str(job.id),
        "job_type": "t.x",
        "attempt": 1,
        "max_attempts": 4,
        "queue": "q1",
    }


def test_the_start_banner_names_version_queues_concurrency_and_types(
    store: Store,
    registry: Registry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry.register("b.two", lambda ctx, job: None)
    registry.register("a.one", lambda ctx, job: None)
    caplog.set_level(logging.INFO, logger="jobrun")
    worker = Worker(
        store,
        registry,
        jobrun.WorkerConfig(queues={"emails": 4, "default": None}, concurrency=6),
        database="db.example:5432/app (schema jobrun)",
    )
    worker.start()
    try:
        (banner,) = [r for r in caplog.records if "starting" in r.getMessage()]
    finally:
        worker.stop(5)
    lines = banner.getMessage().splitlines()
    assert lines[0] == f"jobrun {logs.version()} worker {worker.owner} starting"
    assert lines[1:] == [
        "  database:    db.example:5432/app (schema jobrun)",
        "  queues:      emails (at most 4 at once), default",
        "  concurrency: 6",
        "  job types (2):",
        "    . a.one",
        "    . b.two",
    ]
    assert banner.job_types == ["a.one", "b.two"]  # type: ignore[attr-defined]
    assert banner.queues == {"emails": 4, "default": None}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"unknown_type_releases": -1}, "unknown_type_releases"),
        ({"unknown_type_releases": True}, "unknown_type_releases"),
        ({"unknown_type_delay": dt.timedelta(0)}, "unknown_type_delay"),
        ({"success_log_level": "loud"}, "log_success"),
    ],
)
def test_bad_console_and_release_settings_fail_at_construction(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        jobrun.WorkerConfig(**fields)
    assert caught.value.field == field
