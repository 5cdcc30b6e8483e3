"""Prometheus metrics for jobrun: ``pip install 'jobrun[metrics]'``.

::

    from prometheus_client import start_http_server
    from jobrun.observe.metrics import Metrics

    metrics = Metrics()
    worker = Worker(store, registry, config, hooks=[metrics])
    metrics.watch_worker(worker)
    metrics.watch_cluster(store, is_leader=lambda: scheduler.is_leader)
    start_http_server(9464, registry=metrics.registry)

Two kinds of series, collected in different places on purpose:

Per worker process
    counted by the worker's hooks (:class:`Metrics` is a
    :class:`~jobrun.worker.hooks.WorkerHooks`) and read from the watched
    workers at scrape time: jobs started and finished by outcome, run and
    pickup times, handler threads, the jobs buffered ahead of them, the
    Store's round trips (and the successes each recorded), their errors,
    the pool. No label names the process: Prometheus adds ``instance``.
Cluster-wide
    queue depth by state, the oldest ready job's age, the leader, the
    schedules, the notification queue, the recent workflows by state and
    their times to completion: numbers of the whole database, read
    by queries (:class:`jobrun.postgres.stats.ClusterStats`). They are
    collected by :meth:`Metrics.watch_cluster` in ONE process only: where
    ``is_leader`` (if given) returns True, and at most once per
    ``cache_seconds`` however often and by however many scrapers it is
    scraped, so a fleet of workers never multiplies the queries.

Label values are bounded, so that a stray producer cannot explode the
series count: a job's ``type`` label is a type some watched worker has a
handler for (or one a handler was started for), and any other type is the
single value ``unknown``; ``queue`` is one of the queues the worker claims
from; schedule ids and queue names are chosen by the operator. The names and
labels are listed in docs/metrics.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "jobrun.observe.metrics needs prometheus-client: pip install 'jobrun[metrics]'"
    ) from exc

from jobrun.job.errors import ValidationError
from jobrun.job.model import Job
from jobrun.worker.hooks import (
    STORE_OPERATIONS,
    JobOutcome,
    StoreCall,
    WorkerHooks,
    pickup_delay,
)

if TYPE_CHECKING:
    from jobrun.postgres.stats import ClusterSnapshot, ClusterStats, WorkflowStats
    from jobrun.postgres.store import Store
    from jobrun.worker.context import JobContext
    from jobrun.worker.worker import Worker

log = logging.getLogger(__name__)

UNKNOWN_TYPE = "unknown"
"""The ``type`` label of every job type no watched worker has a handler for."""

MAX_LEARNED_TYPES = 1000
"""Types learned from started handlers when no worker is watched; past this, ``unknown``."""

DEFAULT_CACHE_SECONDS = 10.0
DEFAULT_WORKFLOW_WINDOW = 3600.0
"""Seconds: the workflows created this recently are counted (see :meth:`Metrics.watch_cluster`)."""
WORKFLOW_QUANTILES = (0.5, 0.95, 1.0)

# Handlers run from milliseconds to an hour.
RUN_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
# From a woken worker's few milliseconds to a backlog of an hour.
PICKUP_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
)  # fmt: skip
# One round trip: sub-millisecond on a local server, seconds when it struggles.
CALL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
)  # fmt: skip
# Jobs per call: an empty claim (0) is worth seeing; batches grow in powers of two.
BATCH_BUCKETS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)

_DEPTH_STATES = ("ready", "scheduled", "leased", "dead")
_COMPLETING = ("complete", "complete_tx")
"""The completer's operations: every job they carry is a success recorded."""


class Metrics(WorkerHooks):
    """jobrun's Prometheus metrics, in ``registry`` (a new CollectorRegistry when None).

    Pass it as a hook to the workers it counts, then :meth:`watch_worker`
    each of them (for their threads, their pool and their job types); call
    :meth:`watch_cluster` in the process that should collect the
    cluster-wide series. Serve :attr:`registry`
    (``prometheus_client.generate_latest(metrics.registry)``).

    One Metrics per registry: its series names are registered once.
    Thread-safe; every hook is a few dictionary lookups and increments.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._workers: list[Worker] = []
        self._known_types: set[str] = set()
        self._cluster: ClusterCollector | None = None
        # Label children by label values (their sets are bounded, see the module docs).
        self._series: dict[tuple[str, str], _Series] = {}
        self._calls: dict[str, tuple[Any, Any]] = {}

        # Made outside the registry (registry=None), registered below through
        # one collector that leaves out their ``_created`` samples.
        self.jobs_started = Counter(
            "jobrun_jobs_started",
            "Jobs whose handler was started, by queue and type.",
            ["queue", "type"],
            registry=None,
        )
        self.jobs_finished = Counter(
            "jobrun_jobs_finished",
            "Attempts whose outcome was recorded, by queue, type and outcome: succeeded, "
            "failed (to be retried), dead, cancelled, lease_lost, released (unknown type), "
            "snoozed (queued again by the handler, attempt given back), waiting (parked in a "
            "durable wait until it is over).",
            ["queue", "type", "outcome"],
            registry=None,
        )
        self.run_duration = Histogram(
            "jobrun_job_run_duration_seconds",
            "How long handlers ran, by queue and type.",
            ["queue", "type"],
            buckets=RUN_BUCKETS,
            registry=None,
        )
        self.pickup_latency = Histogram(
            "jobrun_job_pickup_latency_seconds",
            "From when a job could first run (max of run_at and created_at) to its claim, "
            "by the database clock.",
            ["queue", "type"],
            buckets=PICKUP_BUCKETS,
            registry=None,
        )
        self.store_call_duration = Histogram(
            "jobrun_store_call_duration_seconds",
            "Round trips of the worker's Store calls (claim, complete, complete_tx, fail, "
            "heartbeat), failed tries included.",
            ["operation"],
            buckets=CALL_BUCKETS,
            registry=None,
        )
        self.store_call_jobs = Histogram(
            "jobrun_store_call_jobs",
            "Jobs carried by each successful Store call: claim batches, completer batches "
            "(complete, complete_tx), heartbeat batches.",
            ["operation"],
            buckets=BATCH_BUCKETS,
            registry=None,
        )
        self.store_call_completed = Histogram(
            "jobrun_store_call_completed_jobs",
            "Handler successes carried by each successful Store call that carried any: "
            "completer batches (complete, complete_tx) and the successes a claim's round "
            "trip completed with it (claim).",
            ["operation"],
            buckets=BATCH_BUCKETS,
            registry=None,
        )
        self.store_call_errors = Counter(
            "jobrun_store_call_errors",
            "Store calls of the worker that raised, by operation and error type "
            "(each retried try counts).",
            ["operation", "error"],
            registry=None,
        )
        self.heartbeat_failures = Counter(
            "jobrun_heartbeat_failures",
            "Heartbeat round trips that failed (leases not extended that time).",
            registry=None,
        )
        for operation in STORE_OPERATIONS:
            self.store_call_duration.labels(operation)
            self.store_call_jobs.labels(operation)
        self._completed = {
            operation: self.store_call_completed.labels(operation)
            for operation in ("claim", *_COMPLETING)
        }
        self.registry.register(
            _WithoutCreated(
                self.jobs_started,
                self.jobs_finished,
                self.run_duration,
                self.pickup_latency,
                self.store_call_duration,
                self.store_call_jobs,
                self.store_call_completed,
                self.store_call_errors,
                self.heartbeat_failures,
            )
        )
        self.registry.register(_WorkerCollector(self))

    # -- watching ----------------------------------------------------------------

    def watch_worker(self, worker: Worker) -> None:
        """Report ``worker``'s handler threads and pool, and bound the type label by its registry.

        It creates no per-job series: a ``(queue, type)`` or ``(queue, type,
        outcome)`` series appears with its first job. Pre-creating them at 0
        would export every queue x type x outcome, most of which never happen
        (a type is rarely enqueued to every queue a worker serves, nor does
        every handler snooze or lose a lease). Call it for every worker that
        has this Metrics as a hook. Safe to call twice.
        """
        with self._lock:
            if any(w is worker for w in self._workers):
                return
            self._workers.append(worker)
            self._known_types.update(worker.registry.types)

    def watch_cluster(
        self,
        store: Store,
        is_leader: Callable[[], bool] | None = None,
        *,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        leader_key: tuple[int, int] | None = None,
        workflow_window: float | None = DEFAULT_WORKFLOW_WINDOW,
    ) -> ClusterCollector:
        """Collect the cluster-wide series through ``store`` in this process.

        ``is_leader``: called at each scrape; while it returns False (or
        raises) nothing is queried and no cluster series is exported, so
        every process can call this and only the scheduler's leader answers.
        Without it this process always collects: call it in one process only.
        At most one round of queries runs per ``cache_seconds``; scrapes in
        between are served from it. ``leader_key`` is the scheduler's leader
        lock (by default the one :class:`jobrun.Runtime` takes for the
        store's schema).

        ``workflow_window``: the workflows created in the last this many
        seconds are counted by state (``jobrun_workflows``) and the finished
        ones give the times to completion
        (``jobrun_workflow_completion_seconds``), read from the database in
        the same round (the newest 10,000 at most; their jobs are read by
        ``workflow_id``); None leaves both out.
        """
        from jobrun.postgres.leader import election_name, leader_lock_name  # noqa: PLC0415
        from jobrun.postgres.lock import LOCK_LEADER, lock_key  # noqa: PLC0415
        from jobrun.postgres.stats import ClusterStats  # noqa: PLC0415

        if isinstance(cache_seconds, bool) or not isinstance(cache_seconds, int | float):
            raise ValidationError("cache_seconds", "must be a number of seconds")
        if not 0 <= cache_seconds <= 3600:
            raise ValidationError("cache_seconds", "must be between 0 and 3600")
        if workflow_window is not None and (
            isinstance(workflow_window, bool)
            or not isinstance(workflow_window, int | float)
            or not 1 <= workflow_window <= 30 * 86400
        ):
            raise ValidationError(
                "workflow_window", "must be between 1 and 2592000 seconds, or None"
            )
        if is_leader is not None and not callable(is_leader):
            raise ValidationError("is_leader", "must be a callable returning a bool, or None")
        with self._lock:
            if self._cluster is not None:
                raise ValidationError("store", "this Metrics already watches a cluster")
            if leader_key is None:
                leader_key = lock_key(LOCK_LEADER, leader_lock_name(store.schema))
            # The lease row of workers behind a transaction pooler: the same election.
            election = election_name(leader_lock_name(store.schema))
            collector = ClusterCollector(
                ClusterStats(store, leader_key=leader_key, election=election),
                is_leader,
                cache_seconds=float(cache_seconds),
                queues=lambda: [q for w in self._watched() for q in w.config.queues],
                workflow_window=None if workflow_window is None else float(workflow_window),
            )
            self._cluster = collector
        self.registry.register(collector)
        return collector

    @property
    def cluster(self) -> ClusterCollector | None:
        """The cluster collector :meth:`watch_cluster` made, if any."""
        return self._cluster

    def _watched(self) -> list[Worker]:
        with self._lock:
            return list(self._workers)

    # -- hooks -------------------------------------------------------------------

    def job_started(self, job: Job, ctx: JobContext) -> None:
        series = self._series_of(job.queue, self._learn(job.type))
        series.count_started()
        series.observe_pickup(pickup_delay(job))

    def job_finished(self, outcome: JobOutcome) -> None:
        job = outcome.job
        job_type = UNKNOWN_TYPE if outcome.kind == "released" else self.type_label(job.type)
        series = self._series_of(job.queue, job_type)
        series.count_finished(outcome.kind)
        if outcome.duration is not None:
            series.observe_duration(outcome.duration)
        if job_type == UNKNOWN_TYPE and outcome.duration is None:
            # No handler started it, so job_started never saw this claim.
            series.observe_pickup(pickup_delay(job))

    def store_call(self, call: StoreCall) -> None:
        children = self._calls.get(call.operation)
        if children is None:
            children = self._calls[call.operation] = (
                self.store_call_duration.labels(call.operation),
                self.store_call_jobs.labels(call.operation),
            )
        duration, jobs = children
        duration.observe(call.seconds)
        if call.error is None:
            jobs.observe(call.jobs)
            completed = call.jobs if call.operation in _COMPLETING else call.completed
            if completed:
                # A claim's round trip records the successes it carried: counted
                # here, or they would vanish from the completions per round trip.
                self._completed[call.operation].observe(completed)
            return
        self.store_call_errors.labels(call.operation, type(call.error).__name__).inc()
        if call.operation == "heartbeat":
            self.heartbeat_failures.inc()

    def _series_of(self, queue: str, job_type: str) -> _Series:
        """The label children of (queue, type), looked up once (``labels()`` costs more)."""
        key = (queue, job_type)
        series = self._series.get(key)
        if series is None:
            series = self._series.setdefault(key, _Series(self, queue, job_type))
        return series

    # -- labels ------------------------------------------------------------------

    def type_label(self, job_type: str) -> str:
        """``job_type`` when a watched worker handles it (or a handler ran for it), else unknown."""
        return job_type if job_type in self._known_types else UNKNOWN_TYPE

    def _learn(self, job_type: str) -> str:
        """A started handler proves its type registered, in a worker this Metrics may not watch."""
        if job_type in self._known_types:
            return job_type
        with self._lock:
            if len(self._known_types) >= MAX_LEARNED_TYPES:
                return UNKNOWN_TYPE
            self._known_types.add(job_type)
        return job_type


class _Series:
    """The children of one (queue, type) label pair, each made by its first event.

    A child made is a series exported (at 0 until counted), so none is made
    ahead: a type whose jobs are all released (no handler) has a pickup
    latency but no ``jobs_started`` nor run duration, and an outcome that
    never happened has no series. ``labels()`` is thread-safe and returns
    the same child to two threads racing to make it.
    """

    __slots__ = ("_labels", "_metrics", "duration", "finished", "pickup", "started")

    def __init__(self, metrics: Metrics, queue: str, job_type: str) -> None:
        self._metrics = metrics
        self._labels = (queue, job_type)
        self.started: Any = None
        self.pickup: Any = None
        self.duration: Any = None
        self.finished: dict[str, Any] = {}

    def count_started(self) -> None:
        if self.started is None:
            self.started = self._metrics.jobs_started.labels(*self._labels)
        self.started.inc()

    def observe_pickup(self, seconds: float) -> None:
        if self.pickup is None:
            self.pickup = self._metrics.pickup_latency.labels(*self._labels)
        self.pickup.observe(seconds)

    def observe_duration(self, seconds: float) -> None:
        if self.duration is None:
            self.duration = self._metrics.run_duration.labels(*self._labels)
        self.duration.observe(seconds)

    def count_finished(self, kind: str) -> None:
        finished = self.finished.get(kind)
        if finished is None:
            finished = self.finished[kind] = self._metrics.jobs_finished.labels(*self._labels, kind)
        finished.inc()


class _WithoutCreated:
    """Collects jobrun's counters and histograms without their ``_created`` samples.

    prometheus_client adds a ``_created`` sample (the Unix time the series
    was made) to every counter and histogram child: a quarter of a worker's
    exposition, which Prometheus stores as separate gauges nobody queries.
    Its switch (``disable_created_metrics()``) is global to the process and
    would change the application's own metrics too, so jobrun leaves out
    only its own, here.
    """

    def __init__(self, *metrics: Any) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return [family for m in self._metrics for family in m.describe()]

    def collect(self) -> Iterable[Metric]:
        families = []
        for m in self._metrics:
            for family in m.collect():
                created = family.name + "_created"
                family.samples = [s for s in family.samples if s.name != created]
                families.append(family)
        return families


class _WorkerCollector:
    """Reads the watched workers' threads and pools at scrape time (no query)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return list(self._families([]))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self._metrics._watched()))

    def _families(self, workers: list[Worker]) -> Iterator[Metric]:
        total = GaugeMetricFamily(
            "jobrun_worker_handler_threads", "Handler threads of the watched workers."
        )
        busy = GaugeMetricFamily(
            "jobrun_worker_handler_threads_busy", "Handler threads running a job right now."
        )
        buffered = GaugeMetricFamily(
            "jobrun_worker_jobs_buffered",
            "Jobs claimed ahead of the free threads right now: leased, not started "
            "(their attempt not counted yet).",
        )
        size = GaugeMetricFamily(
            "jobrun_pool_connections", "Connections open in the workers' pools."
        )
        in_use = GaugeMetricFamily(
            "jobrun_pool_connections_in_use", "Pooled connections checked out right now."
        )
        limit = GaugeMetricFamily(
            "jobrun_pool_connections_max", "The most connections the pools may open."
        )
        waiting = GaugeMetricFamily(
            "jobrun_pool_requests_waiting", "Callers waiting for a pooled connection right now."
        )
        if not workers:
            yield from (total, busy, buffered, size, in_use, limit, waiting)
            return
        total.add_metric([], float(sum(_concurrency(w) for w in workers)))
        busy.add_metric([], float(sum(_busy(w) for w in workers)))
        buffered.add_metric([], float(sum(int(w.buffered) for w in workers)))
        pools: dict[int, Any] = {}
        for w in workers:
            pool = getattr(w.store, "pool", None)
            if pool is not None and callable(getattr(pool, "get_stats", None)):
                pools.setdefault(id(pool), pool)
        if pools:
            stats = [p.get_stats() for p in pools.values()]
            opened = sum(s.get("pool_size", 0) for s in stats)
            size.add_metric([], float(opened))
            in_use.add_metric([], float(opened - sum(s.get("pool_available", 0) for s in stats)))
            limit.add_metric([], float(sum(s.get("pool_max", 0) for s in stats)))
            waiting.add_metric([], float(sum(s.get("requests_waiting", 0) for s in stats)))
        yield from (total, busy, buffered, size, in_use, limit, waiting)


def _concurrency(worker: Worker) -> int:
    return int(worker.concurrency)


def _busy(worker: Worker) -> int:
    return int(worker.threads_busy)


class ClusterCollector:
    """The cluster-wide series: one round of queries per cache period, only while leading.

    The cache period is measured on this process's monotonic clock: it rates
    this process's own queries, not a job's time, so the database clock has
    no say in it. A failed round is cached like a good one (so a database in
    trouble is not hammered by scrapes) and exported as
    ``jobrun_cluster_stats_up 0`` with no stale numbers.
    """

    def __init__(
        self,
        stats: ClusterStats,
        is_leader: Callable[[], bool] | None,
        *,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        queues: Callable[[], Iterable[str]] = list,
        workflow_window: float | None = None,
    ) -> None:
        self.stats = stats
        self.workflow_window = workflow_window
        self.is_leader = is_leader
        self.cache_seconds = cache_seconds
        self._queues = queues
        self._lock = threading.Lock()
        self._snapshot: ClusterSnapshot | None = None
        self._read_at: float | None = None
        self._failed = False  # the cached round failed
        self._failing = False  # the last round that ran failed (survives a step down)
        self._duration = 0.0
        self._seen_queues: set[str] = set()
        self.rounds = 0
        """Rounds of queries run (each is one ClusterStats.snapshot)."""
        self.errors = 0
        """Rounds that failed."""
        self._leader_warned = False

    def describe(self) -> Iterable[Metric]:
        return list(self._families(None, failed=False))

    def collect(self) -> Iterable[Metric]:
        if not self._leading():
            with self._lock:
                # A new term starts from fresh numbers, never a predecessor's.
                self._snapshot, self._read_at, self._failed = None, None, False
            return []
        with self._lock:
            now = time.monotonic()
            if self._read_at is None or now - self._read_at >= self.cache_seconds:
                self._refresh()
                self._read_at = time.monotonic()
            snapshot, failed = self._snapshot, self._failed
        return list(self._families(snapshot, failed=failed))

    def _leading(self) -> bool:
        if self.is_leader is None:
            return True
        try:
            return bool(self.is_leader())
        except Exception as exc:  # noqa: BLE001 - a broken probe means "not leading"
            if not self._leader_warned:
                self._leader_warned = True
                log.warning("is_leader raised %s: %s (not collecting)", type(exc).__name__, exc)
            return False

    def _refresh(self) -> None:
        started = time.monotonic()
        self.rounds += 1
        try:
            snapshot = self.stats.snapshot(workflow_window=self.workflow_window)
        except Exception as exc:  # a scrape must answer, whatever the database does
            self.errors += 1
            if not self._failing:  # once per outage, not once per cache period
                log.warning(
                    "cluster statistics failed: %s: %s", type(exc).__name__, exc, exc_info=exc
                )
            self._snapshot, self._failed, self._failing = None, True, True
        else:
            if self._failing:
                log.info("cluster statistics answer again")
            self._snapshot, self._failed, self._failing = snapshot, False, False
            self._seen_queues.update(q.queue for q in snapshot.queues)
        self._duration = time.monotonic() - started

    def _families(self, snap: ClusterSnapshot | None, *, failed: bool) -> Iterator[Metric]:
        up_family = GaugeMetricFamily(
            "jobrun_cluster_stats_up",
            "1 when the last round of cluster statistics queries succeeded, else 0.",
        )
        errors = CounterMetricFamily(
            "jobrun_cluster_stats_errors",
            "Rounds of cluster statistics queries that failed in this process.",
        )
        duration = GaugeMetricFamily(
            "jobrun_cluster_stats_duration_seconds",
            "How long the last round of cluster statistics queries took.",
        )
        read_at = GaugeMetricFamily(
            "jobrun_cluster_stats_timestamp_seconds",
            "The database clock when the cluster statistics were read (ages from it are "
            "by the database clock).",
        )
        depth = GaugeMetricFamily(
            "jobrun_queue_jobs",
            "Jobs per queue by state: ready (queued, due), scheduled (queued, due later), "
            "leased, dead.",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "jobrun_queue_oldest_ready_age_seconds",
            "How long the oldest ready job of each queue has been due (0 when none is).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "jobrun_queue_paused", "1 while the queue is paused.", labels=["queue"]
        )
        leader = GaugeMetricFamily(
            "jobrun_leader_present",
            "1 while the scheduler has a leader (a session holding its leader lock, or the "
            "holder of its unexpired lease row).",
        )
        leader_info = GaugeMetricFamily(
            "jobrun_leader_info",
            "The scheduler's leader (always 1): a lock's session (pid, application_name, "
            "client_addr), or a lease row's holder and term.",
            labels=["pid", "application_name", "client_addr", "holder", "term"],
        )
        next_run = GaugeMetricFamily(
            "jobrun_schedule_next_run_timestamp_seconds",
            "When each schedule runs next (Unix time).",
            labels=["schedule"],
        )
        last_fired = GaugeMetricFamily(
            "jobrun_schedule_last_fired_timestamp_seconds",
            "When each schedule last materialised an occurrence (Unix time, database clock; "
            "absent before its first).",
            labels=["schedule"],
        )
        schedule_paused = GaugeMetricFamily(
            "jobrun_schedule_paused", "1 while the schedule is paused.", labels=["schedule"]
        )
        notify = GaugeMetricFamily(
            "jobrun_notification_queue_usage_ratio",
            "pg_notification_queue_usage(): how full the server's NOTIFY queue is (1: full).",
        )
        workflows = GaugeMetricFamily(
            "jobrun_workflows",
            "Workflows created in the recent window (jobrun_workflows_window_seconds; the "
            "newest 10,000 at most) by state, derived from their jobs' states: running, "
            "succeeded, failed, cancelled.",
            labels=["state"],
        )
        window = GaugeMetricFamily(
            "jobrun_workflows_window_seconds",
            "How recently the workflows counted by jobrun_workflows were created.",
        )
        truncated = GaugeMetricFamily(
            "jobrun_workflows_truncated",
            "1 when more workflows were created in the window than are counted (the newest "
            "10,000 are).",
        )
        completion = GaugeMetricFamily(
            "jobrun_workflow_completion_seconds",
            "Time to completion (creation to the last job's finish, database clock) of the "
            "finished workflows among those counted by jobrun_workflows: nearest-rank "
            "quantiles 0.5, 0.95 and 1 (the slowest); absent while none has finished.",
            labels=["quantile"],
        )
        completed = GaugeMetricFamily(
            "jobrun_workflows_completed",
            "The finished workflows the completion quantiles are of.",
        )
        families = (
            up_family, errors, duration, read_at, depth, oldest, paused, leader, leader_info,
            next_run, last_fired, schedule_paused, notify, workflows, window, truncated,
            completion, completed,
        )  # fmt: skip
        if snap is None:
            if failed:  # no numbers, but say why
                up_family.add_metric([], 0.0)
                errors.add_metric([], float(self.errors))
                duration.add_metric([], self._duration)
            yield from families
            return
        up_family.add_metric([], 1.0)
        errors.add_metric([], float(self.errors))
        duration.add_metric([], self._duration)
        read_at.add_metric([], snap.db_now.timestamp())
        by_queue = {q.queue: q for q in snap.queues}
        for name in sorted(self._seen_queues.union(self._queues(), by_queue)):
            q = by_queue.get(name)
            counts = (q.ready, q.scheduled, q.leased, q.dead) if q is not None else (0, 0, 0, 0)
            for state, value in zip(_DEPTH_STATES, counts, strict=True):
                depth.add_metric([name, state], float(value))
            oldest.add_metric([name], q.oldest_ready_seconds if q is not None else 0.0)
            paused.add_metric([name], 1.0 if q is not None and q.paused else 0.0)
        leader.add_metric([], 1.0 if snap.leaders else 0.0)
        for s in snap.leaders:
            leader_info.add_metric(
                [
                    "" if s.pid is None else str(s.pid),
                    s.application_name,
                    s.client_addr,
                    s.holder,
                    "" if s.term is None else str(s.term),
                ],
                1.0,
            )
        for sched in snap.schedules:
            next_run.add_metric([sched.id], sched.next_run_at.timestamp())
            if sched.last_fired_at is not None:
                last_fired.add_metric([sched.id], sched.last_fired_at.timestamp())
            schedule_paused.add_metric([sched.id], 1.0 if sched.paused else 0.0)
        notify.add_metric([], snap.notify_queue_usage)
        if snap.workflows is not None:
            _add_workflows(
                snap.workflows,
                workflows=workflows,
                window=window,
                truncated=truncated,
                completion=completion,
                completed=completed,
            )
        yield from families


def _add_workflows(
    stats: WorkflowStats,
    *,
    workflows: GaugeMetricFamily,
    window: GaugeMetricFamily,
    truncated: GaugeMetricFamily,
    completion: GaugeMetricFamily,
    completed: GaugeMetricFamily,
) -> None:
    for state, count in stats.by_state.items():
        workflows.add_metric([state.value], float(count))
    window.add_metric([], stats.window_seconds)
    truncated.add_metric([], 1.0 if stats.truncated else 0.0)
    completed.add_metric([], float(len(stats.completion_seconds)))
    for q in WORKFLOW_QUANTILES:
        value = stats.quantile(q)
        if value is not None:
            completion.add_metric([f"{q:g}"], value)


__all__ = ["UNKNOWN_TYPE", "ClusterCollector", "Metrics"]
