"""Workers on limited queues (Store.set_queue_limits): the limits hold across
workers, a busy key blocks no other, and the workers keep claiming although a
freed slot sends no wake-up. Several workers in this process, against real
PostgreSQL."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import TransientError
from jobrun.job.model import Job, NewJob
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry, Worker, WorkerConfig
from tests.postgres.test_store_limits import _install_oracle
from tests.runtime.conftest import FAST
from tests.support.waiting import wait_for

DEADLINE = 120.0


class Running:
    """How many handlers run at once, across every worker of the test."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.done = 0

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1
            self.done += 1


def states(conn: psycopg.Connection[Any], **where: str) -> dict[str, int]:
    clause = " AND ".join(f"{column} = %({column})s" for column in where) or "true"
    rows = conn.execute(
        f"SELECT state::text, count(*) FROM jobrun.jobs WHERE {clause} GROUP BY state", where
    ).fetchall()
    return {state: n for state, n in rows}


def test_three_workers_never_run_more_than_the_queues_concurrency_limit(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    running = Running()

    def handler(ctx: JobContext, job: Job) -> None:
        with running:
            time.sleep(0.005)

    registry.register("t", handler)
    store.set_queue_limits("q", concurrency=2)
    store.enqueue_batch([NewJob(type="t", queue="q") for _ in range(200)])
    for n in range(3):
        make_worker(queues={"q": None}, concurrency=8, owner=f"worker-{n}")
    wait_for(lambda: states(conn, queue="q") == {"succeeded": 200}, timeout=DEADLINE)
    assert running.done == 200
    assert 1 <= running.most <= 2


def test_a_hot_key_does_not_hold_back_the_cold_keys_behind_it(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    running: dict[str, Running] = {}

    def handler(ctx: JobContext, job: Job) -> None:
        key = job.concurrency_key or ""
        with running.setdefault(key, Running()):
            time.sleep(0.03 if key == "hot" else 0.001)

    registry.register("t", handler)
    store.set_queue_limits("q", per_key=1)
    store.enqueue_batch([NewJob(type="t", queue="q", concurrency_key="hot") for _ in range(100)])
    store.enqueue_batch(
        [NewJob(type="t", queue="q", concurrency_key=f"cold-{n}") for n in range(20)]
    )
    for n in range(2):
        make_worker(queues={"q": None}, concurrency=8, owner=f"worker-{n}")

    def cold_done() -> bool:
        row = conn.execute(
            "SELECT count(*) FROM jobrun.jobs WHERE queue = 'q' AND concurrency_key LIKE 'cold-%%' "
            "AND state = 'succeeded'"
        ).fetchone()
        return row is not None and row[0] == 20

    wait_for(cold_done, timeout=DEADLINE, interval=0.01)
    hot = states(conn, concurrency_key="hot")
    assert hot.get("queued", 0) > 0, hot  # the cold keys did not wait for the hot one
    wait_for(lambda: states(conn, queue="q") == {"succeeded": 120}, timeout=DEADLINE)
    assert running["hot"].most == 1 and running["hot"].done == 100
    assert all(running[f"cold-{n}"].done == 1 for n in range(20))


@pytest.mark.parametrize("workers", [1, 3])
def test_a_rate_limit_starts_no_more_than_its_limit_in_any_window(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
    workers: int,
) -> None:
    registry.register("t", lambda ctx, job: None)
    store.set_queue_limits("q", rate="20/s")
    store.enqueue_batch([NewJob(type="t", queue="q") for _ in range(60)])
    for n in range(workers):
        make_worker(queues={"q": None}, concurrency=8, owner=f"worker-{n}")
    wait_for(lambda: states(conn, queue="q") == {"succeeded": 60}, timeout=DEADLINE)
    claims = [
        at
        for (at,) in conn.execute(
            "SELECT e.at FROM jobrun.job_events e JOIN jobrun.jobs j ON j.id = e.job_id "
            "WHERE j.queue = 'q' AND e.kind = 'claimed' ORDER BY e.at"
        ).fetchall()
    ]
    assert len(claims) == 60
    window = dt.timedelta(seconds=1)
    busiest = max(sum(1 for other in claims if at <= other < at + window) for at in claims)
    assert busiest <= 20
    assert claims[-1] - claims[0] >= 2 * window  # 60 starts at 20/s span two windows at least


def test_a_worker_whose_claim_a_limit_held_back_claims_again_without_a_wake_up(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    # Two workers share one slot. No dispatcher and a poll interval of a
    # minute: only the limited queue's short re-claim can move the jobs on.
    registry.register("t", lambda ctx, job: time.sleep(0.002))
    store.set_queue_limits("q", concurrency=1)
    store.enqueue_batch([NewJob(type="t", queue="q") for _ in range(30)])
    for n in range(2):
        make_worker(
            queues={"q": None},
            concurrency=4,
            owner=f"worker-{n}",
            poll_interval=dt.timedelta(seconds=60),
        )
    wait_for(lambda: states(conn, queue="q") == {"succeeded": 30}, timeout=30)


def test_the_start_banner_names_the_databases_limits_on_the_workers_queues(
    store: Store, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    store.set_queue_limits("emails", concurrency=5, rate="100/s")
    store.set_queue_limits("elsewhere", per_key=1)  # not this worker's queue
    caplog.set_level(logging.INFO, logger="jobrun")
    worker = Worker(store, registry, WorkerConfig(queues={"emails": 2, "default": None}))
    worker.start()
    try:
        (banner,) = [r for r in caplog.records if "starting" in r.getMessage()]
    finally:
        worker.stop(5)
    lines = banner.getMessage().splitlines()
    shared = "emails: concurrency 5, rate 100/s (in the database: for every worker)"
    assert f"  limits:      {shared}" in lines
    assert not any("elsewhere" in line for line in lines)


# -- complete-and-claim: a worker filling a concurrency limit -----------------


class CompletingWithClaims(Store):
    """The real store, counting the completions that ride with claims (the
    rounds of Store.exchange that complete jobs); with ``fail_every``, every
    so many of those rounds fail (a database fault) before anything is sent."""

    def __init__(self, pool: Any, fail_every: int = 0) -> None:
        super().__init__(pool)
        self.fail_every = fail_every
        self.calls = 0
        self.completed = 0
        self.failed = 0
        self.lock = threading.Lock()

    def exchange(self, owner: str, **kwargs: Any) -> Any:
        if not kwargs.get("complete"):
            return super().exchange(owner, **kwargs)
        with self.lock:
            self.calls += 1
            fail = self.fail_every and self.calls % self.fail_every == 0
            if fail:
                self.failed += 1
        if fail:
            raise TransientError("injected: the connection dropped before the claim was sent")
        got = super().exchange(owner, **kwargs)
        with self.lock:
            self.completed += len(got.completed.completed)
        return got


def _succeeded_once_each(conn: psycopg.Connection[Any], n: int) -> None:
    rows = conn.execute(
        "SELECT j.attempts, count(e.*) FILTER (WHERE e.kind = 'succeeded') "
        "FROM jobrun.jobs j LEFT JOIN jobrun.job_events e ON e.job_id = j.id "
        "WHERE j.queue = 'q' GROUP BY j.id, j.attempts"
    ).fetchall()
    assert len(rows) == n
    assert {(attempts, succeeded) for attempts, succeeded in rows} == {(1, 1)}


def _drain_300(store: Store, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    """Run the 300 jobs of queue q on one worker of 4 threads until all succeeded."""
    worker = Worker(store, registry, WorkerConfig(queues={"q": None}, concurrency=4, **FAST))
    worker.start()
    try:
        wait_for(lambda: states(conn, queue="q") == {"succeeded": 300}, timeout=DEADLINE)
    finally:
        worker.stop(timeout=5)


@pytest.mark.parametrize(
    ("limits", "fail_every"),
    [
        ({"concurrency": 4}, 0),
        ({"concurrency": 4}, 3),
        ({"per_key": 1}, 0),
        ({"per_key": 1}, 3),
    ],
)
def test_a_worker_on_a_limited_queue_completes_its_jobs_with_its_claims(
    pool: Any,
    registry: Registry,
    conn: psycopg.Connection[Any],
    limits: dict[str, Any],
    fail_every: int,
) -> None:
    _install_oracle(conn)
    store = CompletingWithClaims(pool, fail_every=fail_every)
    registry.register("t", lambda ctx, job: {"ok": job.id.hex} if job.attempts else None)
    store.set_queue_limits("q", **limits)
    store.enqueue_batch(
        [NewJob(type="t", queue="q", concurrency_key=f"k{n % 7}") for n in range(300)]
    )
    _drain_300(store, registry, conn)
    assert store.completed > 0  # most rode with claims; the rest went to the completer
    if fail_every:
        assert store.failed > 0  # and the completions of a failed one were not lost
    assert conn.execute("SELECT * FROM public.limit_violations").fetchall() == []
    _succeeded_once_each(conn, 300)
    results = conn.execute(
        "SELECT count(*) FROM jobrun.jobs"
        " WHERE queue = 'q' AND result->>'ok' = replace(id::text, '-', '')"
    ).fetchone()
    assert results == (300,)


@pytest.mark.parametrize(
    ("limits", "most_riding"),
    [({"rate": "100000/s"}, 0), ({"concurrency": 1000}, 30)],
)
def test_a_limit_that_does_not_bind_leaves_the_successes_to_the_completer(
    pool: Any,
    registry: Registry,
    conn: psycopg.Connection[Any],
    limits: dict[str, Any],
    most_riding: int,
) -> None:
    # A round that completes commits synchronously: riding with a claim costs
    # the claim its asynchronous commit, worth it only for a slot it frees.
    # A rate limit counts starts (a finished job frees nothing of it), and a
    # concurrency of 1,000 is far above the 4 threads: their successes are
    # batched by the completer. (The last claims of a drain come back short
    # while jobs still run, which counts as binding for a moment: a few may ride.)
    _install_oracle(conn)
    store = CompletingWithClaims(pool)
    registry.register("t", lambda ctx, job: None)
    store.set_queue_limits("q", **limits)
    store.enqueue_batch([NewJob(type="t", queue="q") for _ in range(300)])
    _drain_300(store, registry, conn)
    assert store.completed <= most_riding
    assert conn.execute("SELECT * FROM public.limit_violations").fetchall() == []
    _succeeded_once_each(conn, 300)


def test_stopping_a_worker_that_fills_a_limit_records_every_success_it_ran(
    pool: Any, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    store = CompletingWithClaims(pool)
    registry.register("t", lambda ctx, job: time.sleep(0.01))
    store.set_queue_limits("q", concurrency=4)
    store.enqueue_batch([NewJob(type="t", queue="q") for _ in range(200)])
    worker = Worker(store, registry, WorkerConfig(queues={"q": None}, concurrency=4, **FAST))
    worker.start()
    try:
        wait_for(lambda: states(conn, queue="q").get("succeeded", 0) >= 20, timeout=DEADLINE)
    finally:
        assert worker.stop(timeout=5)
    left = states(conn, queue="q")
    assert "leased" not in left, left  # no success held back by the claimer
    assert left["succeeded"] + left.get("queued", 0) == 200
    assert store.completed > 0


def test_a_limited_queue_with_a_per_worker_limit_beside_a_busy_free_queue_finishes_both(
    pool: Any, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    store = CompletingWithClaims(pool)
    registry.register("t", lambda ctx, job: None)
    store.set_queue_limits("a", concurrency=5)
    store.enqueue_batch([NewJob(type="t", queue="a") for _ in range(50)])
    store.enqueue_batch([NewJob(type="t", queue="b") for _ in range(300)])
    config = WorkerConfig(queues={"a": 1, "b": None}, concurrency=4, **FAST)
    worker = Worker(store, registry, config)
    worker.start()
    try:
        wait_for(lambda: states(conn, queue="a") == {"succeeded": 50}, timeout=DEADLINE)
        wait_for(lambda: states(conn, queue="b") == {"succeeded": 300}, timeout=DEADLINE)
    finally:
        worker.stop(timeout=5)
    assert store.completed > 0


class RecordingClaims(Store):
    """The real store, keeping every job its claims leased (as they came back)."""

    def __init__(self, pool: Any) -> None:
        super().__init__(pool)
        self.claimed: list[Job] = []

    def claim(self, *args: Any, **kwargs: Any) -> list[Job]:
        jobs = super().claim(*args, **kwargs)
        self.claimed += jobs
        return jobs

    def exchange(self, owner: str, **kwargs: Any) -> Any:
        got = super().exchange(owner, **kwargs)
        self.claimed += got.claimed
        return got


def test_a_worker_completing_with_its_claims_leases_no_job_it_cannot_start_at_once(
    pool: Any, registry: Registry, conn: psycopg.Connection[Any]
) -> None:
    # Two threads on a limited queue: "quick" finishes at once and its
    # completion goes with the next claim, while "hang1" and "hang2" hold
    # both threads. "waiting" must stay queued (no job leased to wait for a
    # thread, whose attempt a crash would burn or which would need a start
    # of its own), and every job leased is started by its claim.
    store = RecordingClaims(pool)
    release = threading.Event()
    seen: dict[str, int] = {}

    def handler(ctx: JobContext, job: Job) -> None:
        name = str(job.payload["name"])
        seen[name] = job.attempts
        if name.startswith("hang"):
            release.wait(DEADLINE)

    registry.register("t", handler)
    store.set_queue_limits("q", concurrency=100)
    names = ["quick", "hang1", "hang2", "waiting"]
    jobs = {
        name: store.enqueue(
            NewJob(type="t", queue="q", payload={"name": name}, priority=p, max_attempts=1)
        )
        for p, name in enumerate(names)
    }
    worker = Worker(store, registry, WorkerConfig(queues={"q": None}, concurrency=2, **FAST))
    worker.start()
    try:
        wait_for(lambda: {"hang1", "hang2"} <= set(seen), timeout=DEADLINE)
        wait_for(lambda: states(conn, queue="q").get("succeeded") == 1, timeout=DEADLINE)
        time.sleep(0.5)  # a claim of "waiting" would have come by now
        assert states(conn, queue="q") == {"succeeded": 1, "leased": 2, "queued": 1}
        release.set()
        wait_for(lambda: states(conn, queue="q") == {"succeeded": 4}, timeout=DEADLINE)
    finally:
        release.set()
        worker.stop(timeout=5)
    assert seen == {"quick": 1, "hang1": 1, "hang2": 1, "waiting": 1}
    assert sorted(j.id for j in store.claimed) == sorted(j.id for j in jobs.values())
    assert all(j.started and j.attempts == 1 for j in store.claimed)
