"""Cluster-wide statistics: one round of cheap read-only queries, for metrics.

:class:`ClusterStats` is what :mod:`jobrun.observe.metrics` asks for the
cluster's gauges (queue depth by state, the oldest ready job's age, the
leader, the schedules, the notification queue). Those numbers belong to the
whole cluster, not to a worker, so one process collects them (the metrics
layer decides which, and how often); every worker of a large fleet running
these per scrape would be load for nothing.

What one :meth:`ClusterStats.snapshot` costs: four statements on one pooled
connection (db/query/stats.sql), each reading a partial index or a small
table, never the history of finished jobs
(tests/postgres/test_cluster_stats.py proves it with EXPLAIN on a table of
many succeeded rows). The call is bounded client-side like every other
Store read (the Store's ``call_timeout``), and ages are computed by the
database clock.

Workflows (asked for with ``workflow_window``) are a fifth statement: the
workflows created in the window, at most :data:`MAX_WORKFLOWS_COUNTED`
(the newest), each with its jobs by state, read through ``workflow_jobs``.
Its cost grows with the jobs of those workflows, not with the table's
history (the window's rows of ``workflows_created_idx``, migration 0018,
and of ``workflow_jobs``' primary key, migration 0024). A workflow's state is derived in Python
(:meth:`jobrun.job.workflow.WorkflowState.of`), the rule the dashboard and
the CLI use.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import psycopg

from jobrun.job.model import State
from jobrun.job.workflow import WorkflowState, WorkflowSummary
from jobrun.postgres.leader import election_name
from jobrun.postgres.lock import lock_key
from jobrun.postgres.sqlc.stats import Queries

if TYPE_CHECKING:
    from jobrun.postgres.store import Store


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """One queue's jobs by state, as one snapshot saw them."""

    queue: str
    ready: int
    """Queued and due now."""
    scheduled: int
    """Queued and due later (a delayed job, a retry waiting out its backoff)."""
    leased: int
    dead: int
    oldest_ready_seconds: float
    """How long the oldest ready job has been due, by the database clock (0: none ready)."""
    paused: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LeaderSession:
    """The scheduler's leader: the session holding its leader lock, or the
    holder of its lease row (workers behind a transaction pooler elect one
    with :class:`jobrun.postgres.leader.LeaseLocker`: no session of its own).

    ``application_name`` and ``client_addr`` are blank when the role running
    the query may not see that session's details (another role's session
    without ``pg_read_all_stats``), or, for the address, over a Unix socket.
    """

    pid: int | None
    """The lock's session; None for a lease-row leader."""
    application_name: str
    client_addr: str
    holder: str = ""
    """A lease-row leader's holder id (host, pid and a random part); blank for a lock."""
    term: int | None = None
    """A lease-row leader's term; None for a lock."""
    worker: str = ""
    """The registered worker whose scheduler leads (its id); blank when none is."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleStats:
    id: str
    next_run_at: dt.datetime
    last_fired_at: dt.datetime | None
    """When an occurrence was last materialised (database clock); None before the first."""
    paused: bool


WORKFLOW_WINDOW = 3600.0
"""Seconds: the workflows created this recently are the ones the metrics count."""
MAX_WORKFLOWS_COUNTED = 10_000
"""The most workflows one round counts (the newest of the window)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowStats:
    """The workflows created in a recent window, by state, and how long the finished
    ones took (creation to their last job's finish, by the database clock)."""

    window_seconds: float
    counted: int
    truncated: bool
    """More than :data:`MAX_WORKFLOWS_COUNTED` were created in the window: the newest
    were counted."""
    by_state: Mapping[WorkflowState, int]
    """Every state, zeros included."""
    completion_seconds: tuple[float, ...]
    """Of the finished ones, in increasing order."""

    def quantile(self, q: float) -> float | None:
        """The nearest-rank quantile ``q`` (0 < q <= 1) of the times to completion,
        None when none has finished."""
        values = self.completion_seconds
        if not values:
            return None
        return values[min(len(values), max(1, math.ceil(q * len(values)))) - 1]


def workflow_summary(row: Any) -> WorkflowSummary:
    """A row of a workflow's jobs by state (ClusterRecentWorkflows, WebWorkflowsPage).

    The row's ``finished_at`` is its jobs' last finish: the workflow's
    completion once no job of it can run, None before (WorkflowState.of
    decides, the one rule)."""
    jobs = {
        State.WAITING: row.waiting,
        State.QUEUED: row.queued,
        State.LEASED: row.leased,
        State.SUCCEEDED: row.succeeded,
        State.DEAD: row.dead,
        State.CANCELLED: row.cancelled,
    }
    running = WorkflowState.of(jobs) is WorkflowState.RUNNING
    return WorkflowSummary(
        id=row.id,
        name=getattr(row, "name", ""),
        created_at=row.created_at,
        finished_at=None if running else row.finished_at,
        jobs={state: n for state, n in jobs.items() if n},
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSnapshot:
    db_now: dt.datetime
    """The database clock when the snapshot was read."""
    queues: tuple[QueueStats, ...]
    leaders: tuple[LeaderSession, ...]
    """Normally one, or none while the cluster has no leader."""
    schedules: tuple[ScheduleStats, ...]
    notify_queue_usage: float
    """``pg_notification_queue_usage()``: 0 (empty) to 1 (full: every NOTIFY fails)."""
    workflows: WorkflowStats | None = None
    """Read when asked for (:meth:`ClusterStats.snapshot`)."""


class ClusterStats:
    """The cluster statistics queries on a Store's pool, in the Store's schema.

    ``leader_key`` is the scheduler's leader lock key (``lock_key(LOCK_LEADER,
    name)``) and ``election`` its lease row's name (``election_name(name)``);
    the defaults are the default schema's leader.
    """

    def __init__(
        self,
        store: Store,
        *,
        leader_key: tuple[int, int] | None = None,
        election: str | None = None,
    ) -> None:
        self.store = store
        self.q = Queries(schema=store.schema)
        self.leader_key = leader_key if leader_key is not None else lock_key()
        self.election = election if election is not None else election_name(None)

    def snapshot(self, *, workflow_window: float | None = None) -> ClusterSnapshot:
        """One round of the statistics queries (read-only, on one pooled connection);
        with ``workflow_window`` (seconds), the workflows created that recently too."""
        if workflow_window is None:
            return self.store._on_pool_read(self._read)

        def read(conn: psycopg.Connection[Any]) -> ClusterSnapshot:
            snap = self._read(conn)
            return dataclasses.replace(snap, workflows=self._workflows(conn, workflow_window))

        return self.store._on_pool_read(read)

    def workflows(self, window_seconds: float = WORKFLOW_WINDOW) -> WorkflowStats:
        """The workflows created in the last ``window_seconds``, by state, and their
        times to completion (at most :data:`MAX_WORKFLOWS_COUNTED`, the newest)."""
        return self.store._on_pool_read(lambda conn: self._workflows(conn, window_seconds))

    def _workflows(self, conn: psycopg.Connection[Any], window: float) -> WorkflowStats:
        rows = self.q.cluster_recent_workflows(
            conn, window_seconds=float(window), max_rows=MAX_WORKFLOWS_COUNTED + 1
        )
        truncated = len(rows) > MAX_WORKFLOWS_COUNTED
        summaries = [workflow_summary(r) for r in rows[:MAX_WORKFLOWS_COUNTED]]
        by_state = dict.fromkeys(WorkflowState, 0)
        times = []
        for w in summaries:
            by_state[w.state] += 1
            if w.finished_at is not None:
                times.append(max((w.finished_at - w.created_at).total_seconds(), 0.0))
        return WorkflowStats(
            window_seconds=float(window),
            counted=len(summaries),
            truncated=truncated,
            by_state=by_state,
            completion_seconds=tuple(sorted(times)),
        )

    def _read(self, conn: psycopg.Connection[Any]) -> ClusterSnapshot:
        lock_class, lock_object = self.leader_key
        queues = self.q.cluster_queue_stats(conn)
        leaders = self.q.cluster_leader(
            conn, lock_class=lock_class, lock_object=lock_object, election=self.election
        )
        schedules = self.q.cluster_schedules(conn)
        usage = self.q.cluster_notify_usage(conn)
        assert usage is not None  # a SELECT without FROM always returns its row
        return ClusterSnapshot(
            db_now=usage.db_now,
            queues=tuple(
                QueueStats(
                    queue=r.queue,
                    ready=r.ready,
                    scheduled=r.scheduled,
                    leased=r.leased,
                    dead=r.dead,
                    oldest_ready_seconds=max(r.oldest_ready_seconds, 0.0),
                    paused=r.paused,
                )
                for r in queues
            ),
            leaders=tuple(
                LeaderSession(
                    pid=r.pid if not r.holder else None,
                    application_name=r.application_name,
                    client_addr=r.client_addr,
                    holder=r.holder,
                    term=r.term if r.holder else None,
                    worker=r.worker,
                )
                for r in leaders
            ),
            schedules=tuple(
                ScheduleStats(
                    id=r.id,
                    next_run_at=r.next_run_at,
                    last_fired_at=r.last_fired_at,
                    paused=r.paused,
                )
                for r in schedules
            ),
            notify_queue_usage=usage.usage,
        )


__all__ = [
    "MAX_WORKFLOWS_COUNTED",
    "WORKFLOW_WINDOW",
    "ClusterSnapshot",
    "ClusterStats",
    "LeaderSession",
    "QueueStats",
    "ScheduleStats",
    "WorkflowStats",
    "workflow_summary",
]
