"""Prometheus metrics (jobrun.observe.metrics) of a real worker on real PostgreSQL.

Every number is checked against the database: the outcome counters against
the jobs' events and states, the cluster gauges against a count(*) the test
runs, ages against the database clock. The cluster collector's cost is
counted on the statements it sends.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jobrun.job.errors import TransientError
from jobrun.job.model import Backoff, Job, NewJob, ScheduleSpec, State
from jobrun.observe.http import ObserveServer
from jobrun.observe.metrics import UNKNOWN_TYPE, ClusterCollector, Metrics
from jobrun.postgres.leader import LeaseLocker
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, PermanentFailure, Registry, Worker, WorkerConfig
from jobrun.worker.hooks import StoreCall, WorkerHooks
from tests.support.waiting import wait_for

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)
TTL = dt.timedelta(seconds=30)
FAST = {
    "lease_ttl": dt.timedelta(seconds=3),
    "heartbeat_interval": dt.timedelta(milliseconds=200),
    "poll_interval": dt.timedelta(milliseconds=200),
    "shutdown_grace": dt.timedelta(seconds=5),
}


class Scrape:
    """One scrape of a registry, parsed the way Prometheus reads it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        text = generate_latest(registry).decode()
        self.samples: list[tuple[str, dict[str, str], float]] = [
            (s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def get(self, name: str, **labels: str) -> float | None:
        """The value of the one sample with exactly these labels, None when absent."""
        found = [v for n, lab, v in self.samples if n == name and lab == labels]
        assert len(found) <= 1, (name, labels, found)
        return found[0] if found else None

    def total(self, name: str, **labels: str) -> float:
        """The sum over samples whose labels include these."""
        return sum(
            v
            for n, lab, v in self.samples
            if n == name and all(lab.get(k) == x for k, x in labels.items())
        )

    def label_values(self, name: str, label: str) -> set[str]:
        return {lab[label] for n, lab, _ in self.samples if n == name and label in lab}

    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}


class CountingQueries:
    """The stats queries, counting each statement sent (the collector's real cost)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.calls.append(name)
            return fn(*args, **kwargs)

        return counted


def counting(collector: ClusterCollector) -> CountingQueries:
    queries = CountingQueries(collector.stats.q)
    collector.stats.q = queries  # type: ignore[assignment]
    return queries


def enqueue(store: Store, type: str, **fields: Any) -> Job:
    fields.setdefault("backoff", NO_WAIT)
    return store.enqueue(NewJob(type=type, **fields))


def one(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def run_worker(store: Store, registry: Registry) -> Iterator[Callable[..., Worker]]:
    """A started worker with ``metrics`` as its hook, watched before its first claim."""
    workers: list[Worker] = []

    def make(metrics: WorkerHooks, *, watch: bool = True, **config: Any) -> Worker:
        worker = Worker(store, registry, WorkerConfig(**{**FAST, **config}), hooks=[metrics])
        if watch:
            assert isinstance(metrics, Metrics)
            metrics.watch_worker(worker)
        workers.append(worker)
        worker.start()
        return worker

    yield make
    for w in workers:
        w.stop(timeout=5)


EVENTS_BY_TYPE = """
SELECT j.type, e.kind, count(*) FROM jobrun.job_events e JOIN jobrun.jobs j ON j.id = e.job_id
GROUP BY j.type, e.kind
"""

# What a job_events kind is called as a metric outcome.
OUTCOME_OF_EVENT = {
    "succeeded": "succeeded",
    "retrying": "failed",
    "dead": "dead",
    "cancelled": "cancelled",
    "released": "released",
}


# -- per worker ---------------------------------------------------------------------


def test_outcome_counters_match_the_jobs_events_and_states_in_the_database(
    store: Store, registry: Registry, run_worker: Callable[..., Worker], conn: Any
) -> None:
    registry.register("ok", lambda ctx, job: None)

    def boom(ctx: JobContext, job: Job) -> None:
        raise ValueError("boom")

    def fatal(ctx: JobContext, job: Job) -> None:
        raise PermanentFailure("never")

    running, gate = threading.Event(), threading.Event()

    def waits(ctx: JobContext, job: Job) -> None:
        running.set()
        gate.wait(30)

    registry.register("boom", boom)
    registry.register("fatal", fatal)
    registry.register("waits", waits)
    for _ in range(7):
        enqueue(store, "ok")
    boomed = [enqueue(store, "boom", max_attempts=2) for _ in range(3)]
    for _ in range(2):
        enqueue(store, "fatal")
    for _ in range(2):
        enqueue(store, "no.such.type")
    waiting = enqueue(store, "waits", queue="slow")

    metrics = Metrics()
    worker = run_worker(
        metrics,
        concurrency=4,
        queues={"default": None, "slow": None},
        unknown_type_releases=1,
        unknown_type_delay=dt.timedelta(milliseconds=100),
    )
    wait_for(running.is_set)
    busy = wait_for(lambda: Scrape(metrics.registry).get("jobrun_worker_handler_threads_busy"))
    assert 1 <= busy <= 4
    store.cancel(waiting.id)
    gate.set()

    def all_finished() -> bool:
        left = one(conn, "SELECT count(*) FROM jobrun.jobs WHERE finished_at IS NULL")
        return left == 0

    wait_for(all_finished)
    assert all(store.get(j.id).state is State.DEAD for j in boomed)
    expected: dict[tuple[str, str], int] = {}
    claims: dict[str, int] = {}
    for job_type, kind, n in conn.execute(EVENTS_BY_TYPE).fetchall():
        label = job_type if job_type in registry else UNKNOWN_TYPE
        if kind in OUTCOME_OF_EVENT:
            key = (label, OUTCOME_OF_EVENT[kind])
            expected[key] = expected.get(key, 0) + n
        if kind == "claimed":
            claims[label] = claims.get(label, 0) + n
    assert expected == {
        ("ok", "succeeded"): 7,
        ("boom", "failed"): 3,
        ("boom", "dead"): 3,
        ("fatal", "dead"): 2,
        ("unknown", "released"): 2,
        ("unknown", "dead"): 2,
        ("waits", "cancelled"): 1,
    }

    def counted() -> dict[tuple[str, str], int]:
        s = Scrape(metrics.registry)
        return {
            (lab["type"], lab["outcome"]): int(v)
            for n, lab, v in s.samples
            if n == "jobrun_jobs_finished_total"
        }

    # The completer's hooks run after its COMMIT. Only outcomes that happened
    # have a series: no zero for (ok, dead), (fatal, failed), ...
    wait_for(lambda: counted() == expected)
    s = Scrape(metrics.registry)
    assert s.get("jobrun_jobs_finished_total", queue="slow", type="waits", outcome="cancelled") == 1
    # Started: every attempt a handler ran, which is every claim of a known type.
    started = {t: int(s.total("jobrun_jobs_started_total", type=t)) for t in registry.types}
    assert (
        started
        == {t: claims[t] for t in registry.types}
        == {
            "ok": 7,
            "boom": 6,
            "fatal": 2,
            "waits": 1,
        }
    )
    assert s.total("jobrun_jobs_started_total", type=UNKNOWN_TYPE) == 0
    assert "no.such.type" not in s.label_values("jobrun_jobs_finished_total", "type")
    # Each handler run has its duration; each claim its pickup latency.
    assert s.get("jobrun_job_run_duration_seconds_count", queue="default", type="ok") == 7
    assert s.get("jobrun_job_run_duration_seconds_count", queue="default", type="boom") == 6
    assert s.total("jobrun_job_pickup_latency_seconds_count") == sum(claims.values()) == 20
    # The claim round trips carried every claim the database recorded.
    assert s.total("jobrun_store_call_jobs_sum", operation="claim") == 20
    assert s.total("jobrun_store_call_duration_seconds_count", operation="claim") >= 1
    assert s.total("jobrun_store_call_jobs_sum", operation="fail") == 3 + 3 + 2 + 2
    # Every handler success went in a completer batch or rode with a claim: the
    # 7 "ok" and the cancelled "waits" (its handler returned; recorded cancelled).
    assert s.total("jobrun_store_call_completed_jobs_sum") == 7 + 1
    assert s.total("jobrun_store_call_errors_total") == 0
    assert s.get("jobrun_heartbeat_failures_total") == 0
    # Threads and pool, read from the worker at scrape time.
    assert s.get("jobrun_worker_handler_threads") == 4
    wait_for(lambda: Scrape(metrics.registry).get("jobrun_worker_handler_threads_busy") == 0)
    pool_max = s.get("jobrun_pool_connections_max")
    assert pool_max == store.pool.max_size
    size, in_use = s.get("jobrun_pool_connections"), s.get("jobrun_pool_connections_in_use")
    assert size is not None and in_use is not None
    assert 0 <= in_use <= size <= pool_max
    assert s.get("jobrun_pool_requests_waiting") == 0
    assert worker.stats["succeeded"] == 7


def test_a_watched_worker_exports_no_per_job_series_before_its_first_job(
    store: Store, registry: Registry
) -> None:
    registry.register("a", lambda ctx, job: None)
    registry.register("b", lambda ctx, job: None)
    metrics = Metrics()
    worker = Worker(store, registry, WorkerConfig(queues={"q1": None, "q2": None}, **FAST))
    metrics.watch_worker(worker)
    metrics.watch_worker(worker)  # twice is once
    s = Scrape(metrics.registry)
    per_job = {n for n in s.names() if n.startswith(("jobrun_jobs_", "jobrun_job_"))}
    assert per_job == set(), "queue x type x outcome series appear with their first job"
    assert s.get("jobrun_worker_handler_threads") == worker.concurrency
    assert s.get("jobrun_worker_handler_threads_busy") == 0
    assert s.get("jobrun_worker_jobs_buffered") == 0
    assert metrics.type_label("b") == "b", "the types it handles are label values"
    assert metrics.type_label("c") == UNKNOWN_TYPE


def get_metrics(server: ObserveServer, accept: str = "") -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/metrics", headers={"Accept": accept} if accept else {}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return str(reply.read().decode())


def test_the_metrics_endpoint_serves_no_created_series_and_only_what_happened(
    store: Store, registry: Registry, run_worker: Callable[..., Worker]
) -> None:
    registry.register("ok", lambda ctx, job: None)
    registry.register("never.enqueued", lambda ctx, job: None)
    for _ in range(3):
        enqueue(store, "ok", queue="a")
    shared = CollectorRegistry()
    Counter("app_requests", "the application's own", registry=shared).inc()
    metrics = Metrics(registry=shared)
    run_worker(metrics, queues={"a": None, "b": None})
    server = ObserveServer(None, shared, host="127.0.0.1", port=0)
    server.start()
    try:
        wait_for(
            lambda: (
                'jobrun_jobs_finished_total{outcome="succeeded",queue="a",type="ok"} 3.0'
                in get_metrics(server)
            )
        )
        text = get_metrics(server)
        openmetrics = get_metrics(server, "application/openmetrics-text; version=1.0.0")
    finally:
        server.stop()
    samples = [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    names = {n for n, _, _ in samples}
    assert [n for n in names if n.startswith("jobrun_") and n.endswith("_created")] == []
    assert not [
        line for line in openmetrics.splitlines() if "jobrun_" in line and "_created" in line
    ]
    # jobrun leaves the process-wide switch alone: the application's series keep theirs.
    assert "app_requests_created" in names

    def series(name: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {tuple(lab[k] for k in labels): v for n, lab, v in samples if n == name}

    assert series("jobrun_jobs_finished_total", "queue", "type", "outcome") == {
        ("a", "ok", "succeeded"): 3.0
    }
    assert series("jobrun_jobs_started_total", "queue", "type") == {("a", "ok"): 3.0}
    assert series("jobrun_job_run_duration_seconds_count", "queue", "type") == {("a", "ok"): 3.0}
    assert series("jobrun_job_pickup_latency_seconds_count", "queue", "type") == {("a", "ok"): 3.0}


def test_a_flood_of_unknown_types_is_one_label_value(
    store: Store, registry: Registry, run_worker: Callable[..., Worker], conn: Any
) -> None:
    registry.register("ok", lambda ctx, job: None)
    for n in range(40):
        enqueue(store, f"stray.type.{n}")
    enqueue(store, "ok")
    metrics = Metrics()
    run_worker(metrics, concurrency=4, unknown_type_releases=0)
    wait_for(lambda: one(conn, "SELECT count(*) FROM jobrun.jobs WHERE finished_at IS NULL") == 0)
    dead = one(
        conn, "SELECT count(*) FROM jobrun.jobs WHERE state = 'dead' AND type LIKE 'stray.%'"
    )
    assert dead == 40

    def finished_dead() -> float:
        return Scrape(metrics.registry).total("jobrun_jobs_finished_total", outcome="dead")

    wait_for(lambda: finished_dead() == 40)
    s = Scrape(metrics.registry)
    for name in (
        "jobrun_jobs_finished_total",
        "jobrun_jobs_started_total",
        "jobrun_job_pickup_latency_seconds_count",
    ):
        assert s.label_values(name, "type") <= {"ok", UNKNOWN_TYPE}, name
    assert (
        s.get("jobrun_jobs_finished_total", queue="default", type="unknown", outcome="dead") == 40
    )
    assert s.get("jobrun_job_pickup_latency_seconds_count", queue="default", type="unknown") == 40


def test_a_metrics_hook_on_an_unwatched_worker_learns_types_from_started_handlers(
    store: Store, registry: Registry, run_worker: Callable[..., Worker], conn: Any
) -> None:
    registry.register("known", lambda ctx, job: None)
    enqueue(store, "known")
    enqueue(store, "stray")
    metrics = Metrics()
    run_worker(metrics, watch=False, unknown_type_releases=0)

    def types() -> set[str]:
        return Scrape(metrics.registry).label_values("jobrun_jobs_finished_total", "type")

    wait_for(lambda: types() == {"known", UNKNOWN_TYPE})
    assert Scrape(metrics.registry).get("jobrun_worker_handler_threads") is None  # not watched


def test_store_call_errors_are_counted_by_kind_and_heartbeat_failures_apart() -> None:
    """Fed to the hook directly: the worker's reporting of calls has its own tests."""
    metrics = Metrics()
    metrics.store_call(StoreCall("heartbeat", 0.2, 3, TransientError("connection lost")))
    metrics.store_call(StoreCall("heartbeat", 0.01, 3))
    metrics.store_call(StoreCall("complete", 0.05, 10, TransientError("server closed")))
    metrics.store_call(StoreCall("complete", 0.004, 8))
    s = Scrape(metrics.registry)
    assert s.get("jobrun_heartbeat_failures_total") == 1
    assert (
        s.get("jobrun_store_call_errors_total", operation="heartbeat", error="TransientError") == 1
    )
    assert (
        s.get("jobrun_store_call_errors_total", operation="complete", error="TransientError") == 1
    )
    assert s.get("jobrun_store_call_duration_seconds_count", operation="complete") == 2
    # A failed call carried no jobs: only the successful batch is a batch size.
    assert s.get("jobrun_store_call_jobs_count", operation="complete") == 1
    assert s.get("jobrun_store_call_jobs_sum", operation="complete") == 8
    assert s.get("jobrun_store_call_jobs_bucket", operation="complete", le="8.0") == 1
    assert s.get("jobrun_store_call_jobs_bucket", operation="complete", le="4.0") == 0


def test_successes_a_claim_carried_count_as_completions_of_that_round_trip() -> None:
    metrics = Metrics()
    metrics.store_call(StoreCall("claim", 0.003, 5, None, ("default",), 3))
    metrics.store_call(StoreCall("claim", 0.003, 4))  # completed nothing: not a completion
    metrics.store_call(StoreCall("claim", 0.2, 0, TransientError("lost"), ("default",), 0))
    metrics.store_call(StoreCall("complete", 0.004, 8))
    metrics.store_call(StoreCall("complete_tx", 0.004, 2, TransientError("server closed")))
    metrics.store_call(StoreCall("heartbeat", 0.01, 6))
    s = Scrape(metrics.registry)
    completed = "jobrun_store_call_completed_jobs"
    assert s.get(f"{completed}_sum", operation="claim") == 3
    assert s.get(f"{completed}_count", operation="claim") == 1
    assert s.get(f"{completed}_sum", operation="complete") == 8
    assert s.get(f"{completed}_count", operation="complete_tx") == 0  # it raised
    assert s.label_values(f"{completed}_count", "operation") == {"claim", "complete", "complete_tx"}
    assert s.get("jobrun_store_call_jobs_sum", operation="claim") == 9  # jobs claimed, as before


def test_jobs_buffered_ahead_of_a_busy_thread_are_a_gauge_matching_the_database(
    store: Store, registry: Registry, run_worker: Callable[..., Worker], conn: Any
) -> None:
    gate = threading.Event()
    registry.register("quick", lambda ctx, job: None)
    registry.register("holds", lambda ctx, job: gate.wait(30))
    metrics = Metrics()
    for _ in range(20):  # a run time and a round trip observed: the buffer has a size
        enqueue(store, "quick")
    worker = run_worker(metrics, concurrency=1, claim_ahead=3)
    unfinished = "SELECT count(*) FROM jobrun.jobs WHERE finished_at IS NULL"
    wait_for(lambda: one(conn, unfinished) == 0)
    enqueue(store, "holds")
    for _ in range(6):
        enqueue(store, "quick")
    waiting = "SELECT count(*) FROM jobrun.jobs WHERE state = 'leased' AND started_at IS NULL"
    try:
        wait_for(lambda: worker.threads_busy == 1 and one(conn, waiting) == 3)
        s = Scrape(metrics.registry)
        assert s.get("jobrun_worker_jobs_buffered") == worker.buffered == 3
    finally:
        gate.set()
    wait_for(lambda: one(conn, unfinished) == 0)
    assert Scrape(metrics.registry).get("jobrun_worker_jobs_buffered") == 0


# -- cluster-wide -------------------------------------------------------------------

DEPTH = """
SELECT queue,
       count(*) FILTER (WHERE state = 'queued' AND run_at <= now()),
       count(*) FILTER (WHERE state = 'queued' AND run_at > now()),
       count(*) FILTER (WHERE state = 'leased'),
       count(*) FILTER (WHERE state = 'dead')
FROM jobrun.jobs GROUP BY queue
"""


def test_cluster_depth_and_age_match_the_database(store: Store, conn: Any) -> None:
    now = store.now()
    for _ in range(3):
        enqueue(store, "t", queue="mail", run_at=now - dt.timedelta(minutes=5))
    enqueue(store, "t", queue="mail", run_at=now + dt.timedelta(hours=2))
    for _ in range(4):
        enqueue(store, "t", queue="img")
    leased = store.claim("w", ["img"], 2, TTL)
    (dying,) = store.claim("w", ["img"], 1, TTL)
    store.fail(dying, "no", None, permanent=True)
    enqueue(store, "t", queue="cron", run_at=now + dt.timedelta(days=1))
    assert len(leased) == 2

    metrics = Metrics()
    metrics.watch_cluster(store, cache_seconds=0)
    before = one(
        conn, "SELECT extract(epoch FROM now() - min(run_at)) FROM jobrun.jobs WHERE queue = 'mail'"
    )
    s = Scrape(metrics.registry)
    after = one(
        conn, "SELECT extract(epoch FROM now() - min(run_at)) FROM jobrun.jobs WHERE queue = 'mail'"
    )
    for queue, ready, scheduled, n_leased, dead in conn.execute(DEPTH).fetchall():
        got = [
            s.get("jobrun_queue_jobs", queue=queue, state=st)
            for st in ("ready", "scheduled", "leased", "dead")
        ]
        assert got == [ready, scheduled, n_leased, dead], queue
    assert s.get("jobrun_queue_jobs", queue="img", state="leased") == 2
    assert s.get("jobrun_queue_jobs", queue="img", state="dead") == 1
    assert s.get("jobrun_queue_jobs", queue="cron", state="scheduled") == 1
    age = s.get("jobrun_queue_oldest_ready_age_seconds", queue="mail")
    assert age is not None and float(before) <= age <= float(after)
    assert age >= 300
    assert s.get("jobrun_queue_oldest_ready_age_seconds", queue="cron") == 0  # none ready
    read_at = s.get("jobrun_cluster_stats_timestamp_seconds")
    assert read_at is not None and now.timestamp() <= read_at <= store.now().timestamp()
    assert s.get("jobrun_cluster_stats_up") == 1
    assert s.get("jobrun_leader_present") == 0
    usage = s.get("jobrun_notification_queue_usage_ratio")
    assert usage is not None and 0 <= usage < 1


def test_a_drained_queue_reads_zero_instead_of_vanishing(store: Store, conn: Any) -> None:
    job = enqueue(store, "t", queue="burst")
    metrics = Metrics()
    metrics.watch_cluster(store, cache_seconds=0)
    assert Scrape(metrics.registry).get("jobrun_queue_jobs", queue="burst", state="ready") == 1
    (claim,) = store.claim("w", ["burst"], 1, TTL)
    store.complete(claim)
    assert job.id == claim.id
    s = Scrape(metrics.registry)
    assert [s.get("jobrun_queue_jobs", queue="burst", state=st) for st in ("ready", "leased")] == [
        0,
        0,
    ]


def test_the_leader_and_who_holds_the_lock(store: Store, dsn: str) -> None:
    metrics = Metrics()
    metrics.watch_cluster(store, cache_seconds=0)
    assert Scrape(metrics.registry).get("jobrun_leader_present") == 0
    # The lock jobrun.Runtime's scheduler takes for the default schema.
    with AdvisoryLocker(dsn, None) as locker:
        assert locker.try_acquire()
        s = Scrape(metrics.registry)
        assert s.get("jobrun_leader_present") == 1
        (info,) = [lab for n, lab, v in s.samples if n == "jobrun_leader_info" and v == 1]
        assert info["pid"] == str(locker.backend_pid)
        assert info["application_name"] == "jobrun-leader"
        locker.release()
        s = Scrape(metrics.registry)
    assert s.get("jobrun_leader_present") == 0
    assert "jobrun_leader_info" not in s.names()


def test_a_lease_row_leader_is_present_with_its_holder_and_term(store: Store) -> None:
    """The election of workers behind a transaction pooler (jobrun.postgres.leader)."""
    metrics = Metrics()
    metrics.watch_cluster(store, cache_seconds=0)
    locker = LeaseLocker(store, None)  # the default schema's election, as jobrun.Runtime's
    assert locker.try_acquire()
    try:
        s = Scrape(metrics.registry)
        assert s.get("jobrun_leader_present") == 1
        (info,) = [lab for n, lab, v in s.samples if n == "jobrun_leader_info" and v == 1]
        assert (info["pid"], info["holder"], info["term"]) == ("", locker.holder, "1")
    finally:
        locker.release()
    assert Scrape(metrics.registry).get("jobrun_leader_present") == 0


def test_schedules_next_run_and_last_fire(store: Store, conn: Any) -> None:
    store.create_schedule(ScheduleSpec(id="digest", cron="* * * * *", type="t"))
    store.create_schedule(ScheduleSpec(id="paused", cron="0 0 1 1 *", type="t"))
    store.pause_schedule("paused")
    metrics = Metrics()
    metrics.watch_cluster(store, cache_seconds=0)
    s = Scrape(metrics.registry)
    next_run = store.get_schedule("digest").next_run_at.timestamp()
    assert s.get("jobrun_schedule_next_run_timestamp_seconds", schedule="digest") == next_run
    assert s.get("jobrun_schedule_last_fired_timestamp_seconds", schedule="digest") is None
    assert s.get("jobrun_schedule_paused", schedule="paused") == 1
    assert s.get("jobrun_schedule_paused", schedule="digest") == 0

    conn.execute(
        "UPDATE jobrun.schedules SET next_run_at = now() - interval '1 minute' WHERE id = 'digest'"
    )
    now = store.now()
    (due,) = store.due_schedules(now, 10)
    assert store.materialize(due, now) is not None
    fired = one(conn, "SELECT last_fired_at FROM jobrun.schedules WHERE id = 'digest'")
    s = Scrape(metrics.registry)
    assert (
        s.get("jobrun_schedule_last_fired_timestamp_seconds", schedule="digest")
        == fired.timestamp()
    )
    assert s.get("jobrun_schedule_next_run_timestamp_seconds", schedule="digest") > now.timestamp()


def test_the_cluster_collector_queries_nothing_while_not_the_leader(store: Store) -> None:
    enqueue(store, "t")
    leading = threading.Event()
    metrics = Metrics()
    collector = metrics.watch_cluster(store, is_leader=leading.is_set, cache_seconds=0)
    queries = counting(collector)
    for _ in range(3):
        s = Scrape(metrics.registry)
        assert not [n for n in s.names() if n.startswith(("jobrun_queue_", "jobrun_cluster_"))]
    assert queries.calls == []
    assert collector.rounds == 0

    leading.set()
    s = Scrape(metrics.registry)
    assert s.get("jobrun_queue_jobs", queue="default", state="ready") == 1
    assert len(queries.calls) == 5 and collector.rounds == 1

    leading.clear()
    Scrape(metrics.registry)
    assert len(queries.calls) == 5


def test_an_is_leader_that_raises_counts_as_not_leading(store: Store) -> None:
    def broken() -> bool:
        raise RuntimeError("no idea")

    metrics = Metrics()
    queries = counting(metrics.watch_cluster(store, is_leader=broken))
    assert "jobrun_queue_jobs" not in Scrape(metrics.registry).names()
    assert queries.calls == []


def test_two_scrapes_inside_the_cache_period_run_the_queries_once(store: Store) -> None:
    enqueue(store, "t")
    metrics = Metrics()
    collector = metrics.watch_cluster(store, cache_seconds=3600)
    queries = counting(collector)
    first = Scrape(metrics.registry)
    enqueue(store, "t")
    second = Scrape(metrics.registry)
    assert len(queries.calls) == 5 and collector.rounds == 1
    assert sorted(queries.calls) == sorted(
        [
            "cluster_queue_stats",
            "cluster_leader",
            "cluster_schedules",
            "cluster_notify_usage",
            "cluster_recent_workflows",
        ]
    )
    # Served from the round: the second job is not seen until the next one.
    ready = "jobrun_queue_jobs"
    assert first.get(ready, queue="default", state="ready") == 1
    assert second.get(ready, queue="default", state="ready") == 1


def test_concurrent_scrapes_share_one_round(store: Store) -> None:
    metrics = Metrics()
    collector = metrics.watch_cluster(store, cache_seconds=3600)
    queries = counting(collector)
    barrier = threading.Barrier(8, timeout=30)
    results: list[Scrape] = []

    def scrape() -> None:
        barrier.wait()
        results.append(Scrape(metrics.registry))

    threads = [threading.Thread(target=scrape) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 8
    assert len(queries.calls) == 5 and collector.rounds == 1


def test_after_the_cache_period_a_scrape_runs_a_new_round(store: Store) -> None:
    enqueue(store, "t")
    metrics = Metrics()
    collector = metrics.watch_cluster(store, cache_seconds=0.2)
    queries = counting(collector)
    Scrape(metrics.registry)
    enqueue(store, "t")
    time.sleep(0.3)
    s = Scrape(metrics.registry)
    assert collector.rounds == 2 and len(queries.calls) == 10
    assert s.get("jobrun_queue_jobs", queue="default", state="ready") == 2


def test_a_failed_round_reports_down_without_stale_numbers(dsn: str) -> None:
    pool = open_pool(dsn, concurrency=1)
    store = Store(pool)
    enqueue(store, "t")
    metrics = Metrics()
    collector = metrics.watch_cluster(store, cache_seconds=0)
    assert Scrape(metrics.registry).get("jobrun_queue_jobs", queue="default", state="ready") == 1
    pool.close()
    s = Scrape(metrics.registry)
    assert s.get("jobrun_cluster_stats_up") == 0
    assert s.get("jobrun_cluster_stats_errors_total") == 1
    assert "jobrun_queue_jobs" not in s.names()
    assert collector.errors == 1


def test_watch_cluster_twice_is_refused(store: Store) -> None:
    metrics = Metrics()
    metrics.watch_cluster(store)
    with pytest.raises(Exception, match="already watches a cluster"):
        metrics.watch_cluster(store)


def test_metrics_can_share_a_registry_with_other_collectors() -> None:
    shared = CollectorRegistry()
    Counter("app_requests", "the application's own", registry=shared).inc()
    metrics = Metrics(registry=shared)
    s = Scrape(metrics.registry)
    assert metrics.registry is shared
    assert s.get("app_requests_total") == 1
    assert s.get("jobrun_heartbeat_failures_total") == 0


# -- the optional dependency ------------------------------------------------------------


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_import_jobrun_never_imports_prometheus_client() -> None:
    done = run_python(
        "import sys, jobrun, jobrun.observe, jobrun.worker, jobrun.runtime\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
        "print('clean')"
    )
    assert done.returncode == 0 and done.stdout.strip() == "clean", done.stderr


def test_without_prometheus_client_the_import_error_says_what_to_install() -> None:
    done = run_python(
        "import sys\n"
        "sys.modules['prometheus_client'] = None\n"
        "try:\n"
        "    import jobrun.observe.metrics\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'jobrun[metrics]'" in done.stdout
