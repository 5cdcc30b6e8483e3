"""Load and contention: many claimers, enqueue storms, deadlock-prone batches (4, 12, 14)."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import IdempotencyConflict, ValidationError
from jobrun.job.model import Job, NewJob, State
from jobrun.postgres.store import Store
from tests.faults.app import commit_for
from tests.faults.harness import QUICK_RETRY, TTL, Workers, scalar, states, wait_until
from tests.faults.oracle import Oracle, side_log_records

# -- 4. 4 processes x 32 threads over 50,000 jobs ------------------------------------------

LOAD_JOBS = 50_000
LOAD_TX_EVERY = 10  # one job in ten takes the transactional path


def test_four_processes_of_32_threads_run_50000_jobs_each_exactly_once(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Path,
    oracle: Oracle,
) -> None:
    jobs = [
        NewJob(type="tx.work" if i % LOAD_TX_EVERY == 0 else "plain.fast", backoff=QUICK_RETRY)
        for i in range(LOAD_JOBS)
    ]
    assert store.enqueue_batch(jobs).inserted == LOAD_JOBS
    oracle.enqueued(jobs)
    started = time.monotonic()
    procs = [workers.start(concurrency=32) for _ in range(4)]

    def done() -> bool:
        return scalar(conn, "SELECT count(*) FROM jobrun.jobs WHERE state <> 'succeeded'") == 0

    wait_until(done, 420, f"{LOAD_JOBS} jobs succeed\n{workers.outputs()}", interval=0.5)
    elapsed = time.monotonic() - started
    print(f"\n{LOAD_JOBS} jobs on 4 x 32 threads in {elapsed:.1f} s")
    assert all(p.alive() for p in procs)
    # One claim each: nobody lost a lease, nothing ran twice.
    retried = conn.execute(
        "SELECT j.id, j.type, j.last_error, array_agg(e.kind ORDER BY e.id)"
        " FROM jobrun.jobs j JOIN jobrun.job_events e ON e.job_id = j.id WHERE j.attempts > 1"
        " GROUP BY 1, 2, 3 LIMIT 5"
    ).fetchall()
    assert retried == [], f"{retried}\n{workers.outputs()[-3000:]}"
    assert (
        scalar(conn, "SELECT count(*) FROM jobrun.job_events WHERE kind = 'claimed'") == LOAD_JOBS
    )
    assert scalar(conn, "SELECT count(*) FROM effects") == LOAD_JOBS // LOAD_TX_EVERY
    # Every process took part.
    assert {r["pid"] for r in side_log_records(side_log)} == {p.pid for p in procs}
    oracle.watch(oracle.default_url, settled=True, runs_exactly_once=True)


# -- 14. duplicate enqueue storms -------------------------------------------------------------


def _storm(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run ``fn(i)`` in ``n`` threads released together; results (or exceptions) in order."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(i)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), name=f"storm-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_64_threads_enqueueing_one_key_get_one_job_and_a_defined_answer_each(
    store: Store, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    sent = [
        NewJob(type="tx.work", payload={"n": 1}, idempotency_key="storm", backoff=QUICK_RETRY)
        for _ in range(64)
    ]
    results = _storm(64, lambda i: store.enqueue(sent[i]))
    errors = [r for r in results if not isinstance(r, Job)]
    assert errors == []
    stored = {r.id for r in results}
    assert len(stored) == 1
    winner = stored.pop()
    assert sum(1 for job in sent if job.id == winner) == 1  # one insert, 63 replays
    assert scalar(conn, "SELECT count(*) FROM jobrun.jobs") == 1
    oracle.enqueued([winner])

    # Again while the job is claimed and completed: the key stays taken, same answer.
    [claimed] = store.claim("storm-owner", ["default"], 1, TTL)

    again = [
        NewJob(type="tx.work", payload={"n": 1}, idempotency_key="storm", backoff=QUICK_RETRY)
        for _ in range(64)
    ]

    def enqueue_or_complete(i: int) -> Any:
        if i == 0:
            return store.complete(claimed, commit_for(claimed))
        return store.enqueue(again[i])

    results = _storm(64, enqueue_or_complete)
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert results[0].state is State.SUCCEEDED
    assert {r.id for r in results[1:]} == {winner}
    assert scalar(conn, "SELECT count(*) FROM jobrun.jobs") == 1


def test_colliding_batches_insert_each_key_once_and_a_conflict_inserts_nothing(
    store: Store, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    keys = [f"k{i:03d}" for i in range(200)]

    def batch(i: int) -> Any:
        order = list(keys)
        random.Random(i).shuffle(order)
        jobs = [
            NewJob(type="tx.work", payload={"key": k}, idempotency_key=k, backoff=QUICK_RETRY)
            for k in order
        ]
        plain = [NewJob(type="plain.work", backoff=QUICK_RETRY) for _ in range(20)]
        result = store.enqueue_batch(jobs + plain)
        return result, plain

    results = _storm(8, batch)
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert sum(r.inserted for r, _ in results) == len(keys) + 8 * 20
    assert sum(len(r.replayed) for r, _ in results) == 7 * len(keys)
    for _, plain in results:
        oracle.enqueued(plain)
    oracle.enqueued(
        r[0] for r in conn.execute("SELECT id FROM jobrun.jobs WHERE idempotency_key IS NOT NULL")
    )
    assert scalar(conn, "SELECT count(DISTINCT idempotency_key) FROM jobrun.jobs") == len(keys)
    before = scalar(conn, "SELECT count(*) FROM jobrun.jobs")

    # A batch whose key is taken by a different body: all or nothing.
    conflicting = [NewJob(type="plain.work") for _ in range(5)] + [
        NewJob(type="tx.work", payload={"other": True}, idempotency_key="k100")
    ]
    with pytest.raises(IdempotencyConflict) as info:
        store.enqueue_batch(conflicting)
    assert info.value.key == "k100"
    # A key twice inside one batch: refused before any SQL.
    twice = [NewJob(type="plain.work", idempotency_key="dup") for _ in range(2)]
    with pytest.raises(ValidationError):
        store.enqueue_batch(twice)
    assert scalar(conn, "SELECT count(*) FROM jobrun.jobs") == before


# -- 12. deadlock-prone batches in opposite orders ---------------------------------------------


def test_overlapping_batches_in_opposite_orders_never_surface_a_deadlock(
    store: Store, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    deadlocks_before = scalar(
        conn, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    )
    a_jobs = [NewJob(type="plain.work", backoff=QUICK_RETRY) for _ in range(300)]
    store.enqueue_batch(a_jobs)
    oracle.enqueued(a_jobs)
    owned: list[Job] = []
    while len(owned) < 300:
        owned += store.claim("owner-a", ["default"], 100, dt.timedelta(minutes=5))
    b_jobs = [NewJob(type="plain.work", queue="b", backoff=QUICK_RETRY) for _ in range(200)]
    store.enqueue_batch(b_jobs)
    oracle.enqueued(b_jobs)
    expiring: list[Job] = []
    while len(expiring) < 200:
        expiring += store.claim("owner-b", ["b"], 100, dt.timedelta(minutes=5))
    conn.execute(
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 second' WHERE queue = 'b'"
    )

    stop = time.monotonic() + 5
    errors: list[BaseException] = []
    calls = {"n": 0}
    leases = [(j.id, j.lease_token) for j in owned]

    def loop(name: str, step: Callable[[int], Any]) -> threading.Thread:
        def run() -> None:
            i = 0
            while time.monotonic() < stop:
                try:
                    step(i)
                    calls["n"] += 1
                except BaseException as exc:
                    errors.append(exc)
                    return
                i += 1

        t = threading.Thread(target=run, name=name)
        t.start()
        return t

    def keyed_batch(reverse: bool) -> Callable[[int], Any]:
        def step(i: int) -> Any:
            keys = [f"dl-{i}-{k:03d}" for k in range(50)]
            if reverse:
                keys.reverse()
            jobs = [NewJob(type="plain.work", queue="c", idempotency_key=k) for k in keys]
            return store.enqueue_batch(jobs)

        return step

    def heartbeat(reverse: bool) -> Callable[[int], Any]:
        ordered = list(reversed(leases)) if reverse else list(leases)
        return lambda i: store.heartbeat(
            "owner-a",
            ordered,  # type: ignore[arg-type]
            store.now() + dt.timedelta(minutes=5),
        )

    def cancel(i: int) -> Any:
        return store.cancel(random.choice(owned).id)

    def complete_b(i: int) -> Any:
        chunk = expiring[(i * 20) % 200 : (i * 20) % 200 + 20]
        return store.complete_many(list(reversed(chunk)))

    def reap(i: int) -> Any:
        return store.reap_expired(store.now(), 50)

    threads = [
        loop("batch-asc", keyed_batch(False)),
        loop("batch-desc", keyed_batch(True)),
        loop("heartbeat-asc", heartbeat(False)),
        loop("heartbeat-desc", heartbeat(True)),
        loop("cancel", cancel),
        loop("complete-many", complete_b),
        loop("reap", reap),
    ]
    for t in threads:
        t.join(60)
    assert errors == [], [f"{type(e).__name__}: {e}" for e in errors]
    assert calls["n"] > 50
    oracle.enqueued(r[0] for r in conn.execute("SELECT id FROM jobrun.jobs WHERE queue = 'c'"))
    deadlocks = scalar(
        conn, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    )
    print(f"\nserver-side deadlocks during the run: {deadlocks - deadlocks_before}")
    assert states(conn)  # the database is still there and answering
