"""ctx.sleep and ctx.wait_for_signal run by a real worker in this process against
real PostgreSQL: a wait parks its job holding nothing, a signal is never lost
and delivered once, a retry replays what the wait received."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import InvalidState, NotFound, ValidationError
from jobrun.job.model import Backoff, EventKind, Job, NewJob, State
from jobrun.job.signals import SignalTimeout
from jobrun.postgres.notify import Notifier
from jobrun.postgres.store import Store
from jobrun.testing import run_jobs
from jobrun.worker import JobContext, Registry, Worker
from tests.support.waiting import wait_for

NOW = Backoff(kind="constant", base=0.0, jitter=0.0)
HOUR = dt.timedelta(hours=1)


def enqueue(store: Store, type: str, **fields: Any) -> Job:
    fields.setdefault("backoff", NOW)
    return store.enqueue(NewJob(type=type, **fields))


def row(conn: psycopg.Connection[Any], job: Job) -> tuple[Any, ...]:
    found = conn.execute(
        "SELECT state, lease_owner, lease_token, lease_expires_at, run_at, attempts, snoozes"
        " FROM jobrun.jobs WHERE id = %s",
        [job.id],
    ).fetchone()
    assert found is not None
    return tuple(found)


def wait_row(conn: psycopg.Connection[Any], job: Job, step: str) -> tuple[Any, ...] | None:
    found = conn.execute(
        "SELECT signal, until FROM jobrun.job_waits WHERE job_id = %s AND step = %s",
        [job.id, step],
    ).fetchone()
    return None if found is None else tuple(found)


def kinds(store: Store, job: Job) -> list[str]:
    return [str(e.kind) for e in store.events(job.id)]


def test_a_sleep_parks_the_job_holding_nothing_and_resumes_with_its_steps_replayed(
    store: Store, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    calls: list[str] = []

    def handler(ctx: JobContext, job: Job) -> str:
        ctx.step("before", lambda: calls.append("before"))
        ctx.sleep("nap", HOUR)
        calls.append("after")
        return "rested"

    registry.register("napper", handler)
    job = enqueue(store, "napper")
    assert run_jobs(store, registry).ran == 1
    # Parked: queued, no lease, due at the wake-up the database recorded, the
    # attempt given back and no snooze counted.
    state, owner, token, expires, run_at, attempts, snoozes = row(conn, job)
    assert (state, owner, token, expires, attempts, snoozes) == ("queued", None, None, None, 0, 0)
    recorded = wait_row(conn, job, "nap")
    assert recorded is not None and recorded == (None, run_at)
    (db_now,) = conn.execute("SELECT now()").fetchone() or ()
    assert HOUR - dt.timedelta(minutes=1) < run_at - db_now <= HOUR
    assert kinds(store, job)[-1] == EventKind.PARKED
    assert calls == ["before"]

    # Run early (an operator's retry, say): it parks again until the same time.
    conn.execute("UPDATE jobrun.jobs SET run_at = now() WHERE id = %s", [job.id])
    assert run_jobs(store, registry).ran == 1
    assert row(conn, job)[4] == run_at and wait_row(conn, job, "nap") == (None, run_at)
    assert calls == ["before"]  # the step before the sleep was replayed, not run

    # The hour has passed (run_jobs' advance brings the wake-up to now).
    run_jobs(store, registry, advance=HOUR + dt.timedelta(minutes=1))
    done = store.get(job.id)
    assert done.state is State.SUCCEEDED and done.result == "rested"
    assert done.attempts == 1  # two parks, one attempt counted
    assert calls == ["before", "after"]
    assert wait_row(conn, job, "nap") is None
    assert kinds(store, job)[-3:] == ["claimed", "wait_ended", "succeeded"]


def test_a_signal_sent_before_the_wait_begins_is_received_at_once(
    store: Store, registry: Registry
) -> None:
    def handler(ctx: JobContext, job: Job) -> Any:
        return ctx.wait_for_signal("confirmed", timeout=HOUR)

    registry.register("signup", handler)
    job = enqueue(store, "signup")
    sent = store.signal(job.id, "confirmed", {"email": "ada@example.com"}, key="k1")
    assert sent.sent and not sent.woke
    report = run_jobs(store, registry)
    assert report.succeeded == 1
    assert store.get(job.id).result == {"email": "ada@example.com"}
    assert "parked" not in kinds(store, job)
    delivered = [e for e in store.events(job.id) if e.kind is EventKind.SIGNAL_DELIVERED]
    assert [e.detail for e in delivered] == [
        {"step": "confirmed", "signal": "confirmed", "key": "k1", "timed_out": False}
    ]


def test_a_signal_sent_during_the_wait_wakes_the_parked_job_promptly(
    store: Store,
    registry: Registry,
    conn: psycopg.Connection[Any],
    notifier: Notifier,
    make_worker: Callable[..., Worker],
) -> None:
    def handler(ctx: JobContext, job: Job) -> Any:
        return {"got": ctx.wait_for_signal("confirmed", timeout=HOUR)}

    registry.register("signup", handler)
    job = enqueue(store, "signup")
    # Polls every minute: only the signal's wake-up brings the job back soon.
    assert notifier.wait_connected(10)
    worker = make_worker(
        dispatcher=notifier,
        poll_interval=dt.timedelta(seconds=60),
        lease_ttl=dt.timedelta(seconds=300),
    )
    wait_for(lambda: "parked" in kinds(store, job))
    assert row(conn, job)[:4] == ("queued", None, None, None)
    sent = store.signal(job.id, "confirmed", "yes")
    assert sent.sent and sent.woke
    done = wait_for(lambda: (j := store.get(job.id)).state is State.SUCCEEDED and j)
    assert done.result == {"got": "yes"}
    worker.stop(timeout=0.2)  # nothing runs; its claimer's stop waits out a short grace
    signalled = [e for e in store.events(job.id) if e.kind is EventKind.SIGNAL_SENT]
    assert len(signalled) == 1 and signalled[0].detail["woke"] is True  # type: ignore[index]


def test_the_same_key_twice_delivers_once_and_keys_apart_are_taken_oldest_first(
    store: Store, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    got: list[Any] = []

    def handler(ctx: JobContext, job: Job) -> None:
        for n in range(3):
            try:
                got.append(ctx.wait_for_signal("tick", timeout=HOUR, step=f"tick-{n}"))
            except SignalTimeout as exc:
                got.append(f"timeout {exc.step}")

    registry.register("ticks", handler)
    job = enqueue(store, "ticks")
    assert store.signal(job.id, "tick", 1, key="a").sent
    assert not store.signal(job.id, "tick", "ignored", key="a").sent  # a duplicate
    assert store.signal(job.id, "tick", 2).sent  # no key: a signal of its own
    run_jobs(store, registry)
    assert got == [1, 2]  # the third wait is parked
    assert wait_row(conn, job, "tick-2") is not None
    run_jobs(store, registry, advance=HOUR + dt.timedelta(minutes=1))
    assert got == [1, 2, 1, 2, "timeout tick-2"]  # replayed, then timed out
    assert store.get(job.id).state is State.SUCCEEDED
    stored = conn.execute(
        "SELECT key, payload, step FROM jobrun.job_signals WHERE job_id = %s ORDER BY seq",
        [job.id],
    ).fetchall()
    assert [(p, s) for _, p, s in stored] == [(1, "tick-0"), (2, "tick-1")]
    assert kinds(store, job).count("signal_sent") == 2


def test_a_signal_wait_times_out_with_a_typed_error_that_a_retry_replays(
    store: Store, registry: Registry
) -> None:
    seen: list[str] = []

    def handler(ctx: JobContext, job: Job) -> str:
        try:
            ctx.wait_for_signal("confirmed", timeout=dt.timedelta(milliseconds=200))
        except SignalTimeout as exc:
            seen.append(f"{ctx.attempt}: {exc.signal} at {exc.until.tzinfo}")
            if ctx.attempt == 1:
                raise RuntimeError("the reminder failed") from None
            return "reminded"
        return "confirmed"

    registry.register("signup", handler)
    job = enqueue(store, "signup")
    run_jobs(store, registry)
    assert store.get(job.id).state is State.QUEUED
    wait_for(lambda: run_jobs(store, registry, advance=dt.timedelta(seconds=1)).succeeded)
    assert store.get(job.id).result == "reminded"
    assert seen == ["1: confirmed at UTC", "2: confirmed at UTC"]
    ended = [e.detail for e in store.events(job.id) if e.kind is EventKind.WAIT_ENDED]
    assert ended == [{"step": "confirmed", "signal": "confirmed", "key": None, "timed_out": True}]


def test_a_retried_attempt_after_the_wait_replays_the_same_payload(
    store: Store, registry: Registry
) -> None:
    seen: list[tuple[int, Any]] = []

    def handler(ctx: JobContext, job: Job) -> Any:
        payload = ctx.wait_for_signal("approved", timeout=HOUR)
        seen.append((ctx.attempt, payload))
        if ctx.attempt == 1:
            raise RuntimeError("fails after the wait")
        return payload

    registry.register("approval", handler)
    job = enqueue(store, "approval", max_attempts=3)
    run_jobs(store, registry)
    store.signal(job.id, "approved", {"by": "grace"}, key="approval-1")
    run_jobs(store, registry, advance=dt.timedelta(seconds=1))
    assert seen == [(1, {"by": "grace"}), (2, {"by": "grace"})]
    assert store.get(job.id).result == {"by": "grace"}
    assert kinds(store, job).count("signal_delivered") == 1


def test_a_signal_committed_while_the_job_parks_is_not_missed(
    store: Store, registry: Registry, make_store: Callable[..., Store]
) -> None:
    # The signal lands after the wait looked and before the park: the park
    # sees it (it locks the job row first) and makes the job due now.
    other = make_store()
    original = store.await_step

    def then_signal(job: Job, step: str, signal: str | None, seconds: float) -> Any:
        turn = original(job, step, signal, seconds)
        if turn.record is None:
            other.signal(job.id, "go", "late")  # on another connection, committed
        return turn

    store.await_step = then_signal  # type: ignore[method-assign]

    def handler(ctx: JobContext, job: Job) -> Any:
        return ctx.wait_for_signal("go", timeout=HOUR)

    registry.register("racer", handler)
    job = enqueue(store, "racer")
    run_jobs(store, registry)
    done = store.get(job.id)
    assert done.state is State.SUCCEEDED and done.result == "late"
    waiting = [e.detail for e in store.events(job.id) if e.kind is EventKind.PARKED]
    assert len(waiting) == 1 and waiting[0]["ready"] is True  # type: ignore[index]


def test_an_async_handler_sleeps_and_waits_off_the_event_loop(
    store: Store,
    registry: Registry,
    conn: psycopg.Connection[Any],
    make_worker: Callable[..., Worker],
) -> None:
    threads: list[str] = []
    original = store.await_step

    def recording(job: Job, step: str, signal: str | None, seconds: float) -> Any:
        threads.append(threading.current_thread().name)
        return original(job, step, signal, seconds)

    store.await_step = recording  # type: ignore[method-assign]

    async def handler(ctx: JobContext, job: Job) -> Any:
        await ctx.sleep_async("nap", dt.timedelta(milliseconds=50))
        await asyncio.sleep(0)
        return await ctx.wait_for_signal_async("confirmed", timeout=HOUR)

    registry.register("async-signup", handler)
    job = enqueue(store, "async-signup")
    make_worker(poll_interval=dt.timedelta(milliseconds=100))
    # The sleep parks and ends; then the signal wait parks (for an hour).
    wait_for(lambda: wait_row(conn, job, "confirmed") and kinds(store, job)[-1] == "parked")
    store.signal(job.id, "confirmed", [1, 2])
    done = wait_for(lambda: (j := store.get(job.id)).state is State.SUCCEEDED and j)
    assert done.result == [1, 2]
    assert threads and all(t.startswith("jobrun-async-io") for t in threads)


def test_a_plain_wait_called_from_a_coroutine_is_refused(store: Store, registry: Registry) -> None:
    async def handler(ctx: JobContext, job: Job) -> None:
        with pytest.raises(ValidationError, match="sleep_async"):
            ctx.sleep("nap", 1)
        with pytest.raises(ValidationError, match="wait_for_signal_async"):
            ctx.wait_for_signal("x", timeout=1)

    registry.register("refused", handler)
    enqueue(store, "refused")
    assert run_jobs(store, registry).succeeded == 1


def test_signal_refuses_bad_input_a_missing_job_and_a_finished_one_before_writing(
    store: Store, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    registry.register("noop", lambda ctx, job: None)
    job = enqueue(store, "noop")
    for name, payload, key in [
        ("", None, "k"),
        ("x" * 201, None, "k"),
        (5, None, "k"),
        ("ok", {"bad": object()}, "k"),
        ("ok", None, ""),
        ("ok", None, "k\x00"),
    ]:
        with pytest.raises(ValidationError):
            store.signal(job.id, name, payload, key=key)  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        store.signal(uuid.uuid4(), "ok", key="k")
    run_jobs(store, registry)
    with pytest.raises(InvalidState, match="cannot signal"):
        store.signal(job.id, "ok", key="k")
    assert conn.execute("SELECT count(*) FROM jobrun.job_signals").fetchone() == (0,)


def test_a_wait_step_name_is_a_step_name_once_per_attempt(store: Store, registry: Registry) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        if ctx.attempt == 1:
            ctx.step("recorded", lambda: 1)
            raise RuntimeError("again")
        ctx.step("shared", lambda: 1)
        with pytest.raises(ValidationError, match="already used"):
            ctx.sleep("shared", 1)
        with pytest.raises(ValidationError, match="duration"):
            ctx.sleep("nap", 0)
        with pytest.raises(ValidationError, match="timeout"):
            ctx.wait_for_signal("s", timeout=-1)
        with pytest.raises(ValidationError, match="not by a durable wait"):
            ctx.sleep("recorded", 1)  # recorded by ctx.step on the first attempt

    registry.register("names", handler)
    job = enqueue(store, "names")
    report = run_jobs(store, registry, advance=dt.timedelta(seconds=1))
    assert report.succeeded == 1, store.get(job.id).last_error


def test_signals_racing_their_jobs_waits_are_never_missed(
    store: Store,
    registry: Registry,
    make_store: Callable[..., Store],
    make_worker: Callable[..., Worker],
) -> None:
    # Signals sent at every moment of their jobs' first run (before the wait,
    # while it looks, while it parks, once parked): a missed one would leave
    # its job parked for the hour of its timeout.
    def handler(ctx: JobContext, job: Job) -> Any:
        return ctx.wait_for_signal("go", timeout=HOUR)

    registry.register("race", handler)
    jobs = [enqueue(store, "race", payload={"n": n}) for n in range(24)]
    sender = make_store()

    def send() -> None:
        for n, job in enumerate(jobs):
            time.sleep(0.004 * (n % 5))
            sender.signal(job.id, "go", n)

    thread = threading.Thread(target=send)
    make_worker(concurrency=8)
    thread.start()
    thread.join(30)
    wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in jobs))
    assert [store.get(j.id).result for j in jobs] == list(range(24))


def test_an_async_signal_wait_times_out_with_the_same_typed_error(
    store: Store, registry: Registry
) -> None:
    async def handler(ctx: JobContext, job: Job) -> str:
        try:
            await ctx.wait_for_signal_async("confirmed", timeout=HOUR)
        except SignalTimeout as exc:
            return f"expired: {exc.signal}"
        return "confirmed"

    registry.register("async-expiry", handler)
    job = enqueue(store, "async-expiry")
    run_jobs(store, registry)
    assert store.get(job.id).state is State.QUEUED  # parked for the hour
    run_jobs(store, registry, advance=HOUR + dt.timedelta(minutes=1))
    assert store.get(job.id).result == "expired: confirmed"
