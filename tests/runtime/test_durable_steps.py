"""ctx.step, ctx.transaction_step, the idempotency keys and the fencing token, run
by a real worker in this process against real PostgreSQL (plain and async handlers)."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import LeaseLost, ValidationError
from jobrun.job.model import Backoff, Job, NewJob, State
from jobrun.job.steps import idempotency_key
from jobrun.postgres.store import Store
from jobrun.testing import run_jobs
from jobrun.worker import JobContext, Registry, Snooze, Worker
from tests.support.waiting import wait_for

NOW = Backoff(kind="constant", base=0.0, jitter=0.0)
SOON = dt.timedelta(seconds=1)
"""run_jobs' horizon: the retries (no backoff) run in the same call."""


def enqueue(store: Store, type: str, **fields: Any) -> Job:
    fields.setdefault("backoff", NOW)
    return store.enqueue(NewJob(type=type, **fields))


def steps_of(conn: psycopg.Connection[Any], job: Job) -> dict[str, tuple[int, Any]]:
    rows = conn.execute(
        "SELECT name, attempt, result FROM jobrun.job_steps WHERE job_id = %s", [job.id]
    ).fetchall()
    return {name: (attempt, result) for name, attempt, result in rows}


def test_a_retried_attempt_skips_the_step_done_and_runs_the_next(
    store: Store, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    calls: list[tuple[str, int]] = []
    seen: list[Any] = []

    def handler(ctx: JobContext, job: Job) -> Any:
        def fetch() -> dict[str, Any]:
            calls.append(("fetch", ctx.attempt))
            return {"rows": (1, 2, 3)}

        rows = ctx.step("fetch", fetch)
        seen.append(rows)
        if ctx.attempt == 1:
            raise RuntimeError("the import fails after its first step")

        def add() -> int:
            calls.append(("sum", ctx.attempt))
            return sum(rows["rows"])

        total = ctx.step("sum", add)
        return {"total": total}

    registry.register("import", handler)
    job = enqueue(store, "import", max_attempts=3)
    run_jobs(store, registry, advance=SOON)
    done = store.get(job.id)
    assert done.state is State.SUCCEEDED and done.attempts == 2
    assert done.result == {"total": 6}
    assert calls == [("fetch", 1), ("sum", 2)]  # fetch ran once, on the first attempt
    # The first run and the replay see one value: JSON's (a tuple is a list on both).
    assert seen == [{"rows": [1, 2, 3]}, {"rows": [1, 2, 3]}]
    assert steps_of(conn, job) == {"fetch": (1, {"rows": [1, 2, 3]}), "sum": (2, 6)}


def test_the_steps_are_read_once_per_attempt(
    store: Store, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    loads: list[int] = []
    original = store.load_steps

    def counting(job: Job) -> Any:
        loads.append(1)
        return original(job)

    store.load_steps = counting  # type: ignore[method-assign]

    def handler(ctx: JobContext, job: Job) -> int:
        return sum(ctx.step(f"part-{n}", int, n) for n in range(20))

    registry.register("parts", handler)
    job = enqueue(store, "parts")
    run_jobs(store, registry)
    assert store.get(job.id).result == sum(range(20))
    assert len(loads) == 1


def test_a_step_name_used_twice_in_one_attempt_is_refused_and_a_failed_step_gives_it_back(
    store: Store, registry: Registry
) -> None:
    outcomes: list[str] = []

    def handler(ctx: JobContext, job: Job) -> None:
        ctx.step("a", lambda: 1)
        with pytest.raises(ValidationError, match="already used"):
            ctx.step("a", lambda: 2)
        with pytest.raises(ZeroDivisionError):
            ctx.step("b", lambda: 1 / 0)
        outcomes.append(str(ctx.step("b", lambda: "second try")))
        with pytest.raises(ValidationError, match="step"):
            ctx.step("", lambda: 3)
        with pytest.raises(ValidationError, match="cannot be stored"):
            ctx.step("c", lambda: {"when": object()})

    registry.register("names", handler)
    job = enqueue(store, "names")
    report = run_jobs(store, registry)
    assert report.succeeded == 1, store.get(job.id).last_error
    assert outcomes == ["second try"]


def test_a_transaction_steps_write_lands_once_across_a_failed_attempt(
    store: Store, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("CREATE TABLE public.imported (job_id uuid, n int)")

    def handler(ctx: JobContext, job: Job) -> None:
        def write(c: psycopg.Connection[Any]) -> int:
            c.execute("INSERT INTO public.imported VALUES (%s, %s)", [job.id, ctx.attempt])
            return ctx.attempt

        assert ctx.transaction_step("write", write) == 1  # the first attempt's, replayed
        if ctx.attempt == 1:
            raise RuntimeError("after the transactional step")

    registry.register("tx", handler)
    job = enqueue(store, "tx")
    run_jobs(store, registry, advance=SOON)
    assert store.get(job.id).state is State.SUCCEEDED
    assert conn.execute("SELECT n FROM public.imported").fetchall() == [(1,)]


def test_idempotency_keys_are_stable_across_retries_and_differ_per_step(
    store: Store, registry: Registry
) -> None:
    keys: list[tuple[str, str, str]] = []

    def handler(ctx: JobContext, job: Job) -> None:
        keys.append((ctx.idempotency_key, ctx.step_key("charge"), ctx.step_key("email")))
        if ctx.attempt < 3:
            raise RuntimeError("again")

    registry.register("keys", handler)
    job = enqueue(store, "keys", max_attempts=3)
    keyed = enqueue(store, "keys", max_attempts=3, idempotency_key="order-42")
    run_jobs(store, registry, advance=SOON)
    mine = [k for k in keys if k[0] == idempotency_key(job)]
    assert len(mine) == 3 and len(set(mine)) == 1
    job_key, charge, email = mine[0]
    assert len({job_key, charge, email}) == 3 and len(job_key) == 36
    assert charge == idempotency_key(job, "charge")
    # A keyed job's keys follow its idempotency key (its effect key), not its id.
    assert idempotency_key(keyed) == idempotency_key(store.get(keyed.id))
    theirs = {k for k in keys if k[0] == idempotency_key(keyed)}
    assert len(theirs) == 1 and theirs != set(mine)


def test_the_fencing_token_grows_with_every_run_and_stays_put_within_one(
    store: Store, registry: Registry
) -> None:
    tokens: list[tuple[int, int]] = []

    def handler(ctx: JobContext, job: Job) -> None:
        tokens.append((ctx.fencing_token(), ctx.fencing_token()))
        if ctx.attempt < 3:
            raise RuntimeError("again")

    registry.register("fenced", handler)
    enqueue(store, "fenced", max_attempts=3)
    run_jobs(store, registry, advance=SOON)
    assert [a for a, b in tokens] == [b for a, b in tokens]
    assert [a for a, _ in tokens] == [1, 2, 3]


def test_a_step_whose_lease_was_lost_is_not_recorded_and_cancels_the_handler(
    store: Store,
    registry: Registry,
    conn: psycopg.Connection[Any],
    make_worker: Callable[..., Worker],
) -> None:
    inside, go = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def handler(ctx: JobContext, job: Job) -> None:
        inside.set()
        go.wait(10)
        try:
            ctx.step("late", lambda: "too late")
        except LeaseLost as exc:
            raised.append(exc)
            assert ctx.is_cancelled
            raise

    registry.register("slow", handler)
    job = enqueue(store, "slow")
    make_worker()
    assert inside.wait(10)
    # Another worker's claim takes the job over (the lease ran out, was reaped, claimed).
    conn.execute(
        "UPDATE jobrun.jobs SET state = 'queued', lease_owner = NULL, lease_token = NULL,"
        " lease_expires_at = NULL, run_at = now() + interval '1 hour' WHERE id = %s",
        [job.id],
    )
    go.set()
    wait_for(lambda: raised)
    assert steps_of(conn, job) == {}


def test_an_async_handler_has_the_same_steps_keys_and_fencing(
    store: Store,
    registry: Registry,
    conn: psycopg.Connection[Any],
    make_worker: Callable[..., Worker],
) -> None:
    conn.execute("CREATE TABLE public.imported (job_id uuid, n int)")
    calls: list[str] = []
    threads: list[str] = []
    seen: list[Any] = []
    original = store.record_step

    def recording(job: Job, name: str, value: object) -> Any:
        threads.append(threading.current_thread().name)
        return original(job, name, value)

    store.record_step = recording  # type: ignore[method-assign]

    async def handler(ctx: JobContext, job: Job) -> dict[str, Any]:
        async def fetch() -> list[int]:
            calls.append("fetch")
            await asyncio.sleep(0)
            return [1, 2, 3]

        def write(c: psycopg.Connection[Any]) -> str:
            calls.append("write")
            c.execute("INSERT INTO public.imported VALUES (%s, %s)", [job.id, ctx.attempt])
            return "written"

        rows = await ctx.step_async("fetch", fetch)
        wrote = await ctx.transaction_step_async("write", write)
        token = await ctx.fencing_token_async()
        seen.append((rows, wrote, token, ctx.step_key("fetch")))
        if ctx.attempt == 1:
            raise RuntimeError("after both steps")
        return {"rows": rows, "token": token}

    registry.register("async-import", handler)
    job = enqueue(store, "async-import")
    make_worker()
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)
    assert calls == ["fetch", "write"]  # each once, on the first attempt
    assert [s[:2] for s in seen] == [([1, 2, 3], "written")] * 2
    assert seen[0][2] < seen[1][2] and seen[0][3] == seen[1][3]
    assert conn.execute("SELECT n FROM public.imported").fetchall() == [(1,)]
    assert threads and all(t.startswith("jobrun-async-io") for t in threads)


def test_a_snoozed_job_replays_its_steps_and_its_next_run_gets_a_greater_token(
    store: Store, registry: Registry
) -> None:
    # A snooze gives the attempt back, so two runs share an attempt number:
    # the token still tells them apart (the seam a durable wait builds on).
    runs: list[tuple[int, int]] = []
    sent: list[str] = []

    def handler(ctx: JobContext, job: Job) -> str:
        receipt = ctx.step("send", lambda: sent.append("mail") or "sent")
        runs.append((ctx.attempt, ctx.fencing_token()))
        if len(runs) == 1:
            raise Snooze(dt.timedelta(milliseconds=10))  # waiting for a reply
        return receipt

    registry.register("waits", handler)
    job = enqueue(store, "waits")
    run_jobs(store, registry, advance=SOON)
    done = store.get(job.id)
    assert done.state is State.SUCCEEDED and done.result == "sent"
    assert sent == ["mail"]
    assert runs == [(1, 1), (1, 2)]
