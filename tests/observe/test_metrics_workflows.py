"""The workflow series of the cluster collector (jobrun.observe.metrics) on real PostgreSQL.

Workflows by state are those created in the window, each state derived from
its jobs as the dashboard derives it; the times to completion are checked
against the database's own arithmetic; a workflow created before the window
is not counted; each round reads afresh (no double count across scrapes).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import jobrun
from jobrun.job.errors import ValidationError
from jobrun.job.model import NewJob
from jobrun.job.workflow import WorkflowState
from jobrun.observe.metrics import Metrics
from jobrun.postgres.stats import ClusterStats
from jobrun.postgres.store import Store
from tests.observe.test_metrics import Scrape, counting

TTL = dt.timedelta(seconds=30)
STATES = ("running", "succeeded", "failed", "cancelled")


def enqueue(store: Store, name: str) -> jobrun.EnqueuedWorkflow:
    wf = jobrun.Workflow(name)
    first = wf.add(NewJob(type="wf.a", queue="wf"), name="a")
    wf.add(NewJob(type="wf.b", queue="wf"), after=[first], name="b")
    return jobrun.Client(store).enqueue_workflow(wf)


def run_all(store: Store, *, fail: bool = False) -> None:
    while jobs := store.claim("w", ["wf"], 10, TTL):
        for job in jobs:
            if fail:
                store.fail(job, "boom", None, permanent=True)
            else:
                store.complete(job)


def by_state(s: Scrape) -> dict[str, float | None]:
    return {state: s.get("jobrun_workflows", state=state) for state in STATES}


def test_workflows_by_state_and_their_times_to_completion_match_the_database(
    store: Store, conn: Any
) -> None:
    done = [enqueue(store, f"done-{i}") for i in range(3)]
    run_all(store)
    enqueue(store, "failed")
    run_all(store, fail=True)
    enqueue(store, "running")
    cancelled = enqueue(store, "cancelled")
    store.cancel(cancelled["a"].id)
    old = enqueue(store, "old")
    conn.execute(
        "UPDATE jobrun.workflows SET created_at = now() - interval '2 hours' WHERE id = %s",
        (old.id,),
    )

    metrics = Metrics()
    metrics.watch_cluster(store, cache_seconds=0)
    s = Scrape(metrics.registry)
    assert by_state(s) == {"running": 1, "succeeded": 3, "failed": 1, "cancelled": 1}
    assert s.get("jobrun_workflows_window_seconds") == 3600
    assert s.get("jobrun_workflows_truncated") == 0
    assert s.get("jobrun_workflows_completed") == 5  # the finished ones: 3 + failed + cancelled

    expected = sorted(
        r[0]
        for r in conn.execute(
            """
            SELECT extract(epoch FROM max(j.finished_at) - w.created_at)::float8
            FROM jobrun.workflows w JOIN jobrun.jobs j ON j.workflow_id = w.id
            WHERE w.created_at >= now() - interval '1 hour'
            GROUP BY w.id HAVING bool_and(j.state IN ('succeeded', 'dead', 'cancelled'))
            """
        ).fetchall()
    )
    assert len(expected) == 5
    assert s.get("jobrun_workflow_completion_seconds", quantile="1") == pytest.approx(expected[-1])
    assert s.get("jobrun_workflow_completion_seconds", quantile="0.5") == pytest.approx(expected[2])
    assert s.get("jobrun_workflow_completion_seconds", quantile="0.95") == pytest.approx(
        expected[-1]
    )
    assert all(v >= 0 for v in expected) and {w.id for w in done} <= {
        r[0] for r in conn.execute("SELECT id FROM jobrun.workflows").fetchall()
    }


def test_each_round_reads_afresh_so_a_scrape_never_counts_a_workflow_twice(
    store: Store,
) -> None:
    metrics = Metrics()
    collector = metrics.watch_cluster(store, cache_seconds=0)
    queries = counting(collector)
    empty = Scrape(metrics.registry)
    assert by_state(empty) == dict.fromkeys(STATES, 0)
    assert empty.get("jobrun_workflow_completion_seconds", quantile="0.5") is None
    enqueue(store, "one")
    run_all(store)
    first, second = Scrape(metrics.registry), Scrape(metrics.registry)
    assert by_state(first) == by_state(second) == {
        "running": 0, "succeeded": 1, "failed": 0, "cancelled": 0
    }  # fmt: skip
    assert first.get("jobrun_workflows_completed") == second.get("jobrun_workflows_completed") == 1
    assert queries.calls.count("cluster_recent_workflows") == 3


def test_the_workflow_series_can_be_left_out_and_the_window_is_checked(store: Store) -> None:
    metrics = Metrics()
    collector = metrics.watch_cluster(store, cache_seconds=0, workflow_window=None)
    queries = counting(collector)
    s = Scrape(metrics.registry)
    assert "jobrun_workflows" not in s.names() and "cluster_recent_workflows" not in queries.calls
    for bad in (0, -1, True, "1h", 31 * 86400):
        with pytest.raises(ValidationError, match="workflow_window"):
            Metrics().watch_cluster(store, workflow_window=bad)  # type: ignore[arg-type]


def test_a_short_window_counts_only_the_workflows_created_in_it(store: Store, conn: Any) -> None:
    enqueue(store, "before")
    conn.execute("UPDATE jobrun.workflows SET created_at = now() - interval '10 minutes'")
    enqueue(store, "inside")
    stats = ClusterStats(store).workflows(window_seconds=60)
    assert stats.counted == 1 and stats.by_state[WorkflowState.RUNNING] == 1
    assert stats.quantile(0.5) is None
    assert ClusterStats(store).workflows(window_seconds=3600).counted == 2
